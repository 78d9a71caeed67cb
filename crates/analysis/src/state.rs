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

use std::collections::HashMap;
use std::sync::OnceLock;

use deepspan_model::{
    softirq, BlockRq, Comm, Event, EventKind, Fields, Name, SchedSwitch, Tid, Value, Wakeup,
};

use crate::fxhash::FastMap;
use crate::graph::{Direction, EdgeType, Graph, VertexId};
use crate::held::HeldBack;
use crate::syscalls::{syscall_name, Arch};

/// CPU number used where the CPU is not known.
pub const NO_CPU: u32 = u32::MAX;

/// Largest CPU number accepted; events claiming a larger one are counted
/// and skipped instead of growing per-CPU tables without bound.
pub const MAX_CPUS: u32 = 8192;

/// In a model of several hosts, a thread id carries its host's number in
/// the bits above this one: Linux thread ids stay below 2^22 (`pid_max`'s
/// limit), so `host << HOST_TID_SHIFT | tid` is unique and host 0's ids are
/// the trace's own.
pub const HOST_TID_SHIFT: u32 = 22;

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

/// A `sched_waking` seen while its target still runs elsewhere explains a
/// blocking switch-out of that target only if the switch-out follows within
/// this window (the waker raced the target's way into `schedule()`).
pub const PENDING_WAKING_WINDOW_NS: u64 = 50_000;

/// Deepest interrupt nesting kept per CPU; deeper means exits were lost.
const MAX_NESTING: usize = 32;

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

/// What a switched-out thread became, from `prev_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchOut {
    Preempted,
    Blocked,
    Dead,
}

/// Classifies a switch-out.
///
/// `prev_state` is the raw task state on kernels before 4.14 (preemption
/// adds the `TASK_STATE_MAX` bit, 0x400 to 0x1000 depending on the version)
/// and, since 4.14, one reported bit per state with `TASK_REPORT_MAX`
/// (0x100, printed "R+") for preemption. In both, a runnable thread has no
/// bit set among the low eight. Dead: the thread called `sched_process_exit`
/// (the old `TASK_DEAD` 0x40 collides with the new "parked" bit, so the bit
/// alone cannot say), or the state carries `EXIT_DEAD`/`EXIT_ZOMBIE`
/// (0x10/0x20, the same in both encodings). Everything else (sleeping,
/// disk sleep, stopped, traced, parked, idle) is blocked.
pub fn switch_out(prev_state: i64, exiting: bool) -> SwitchOut {
    if exiting || prev_state & 0x30 != 0 {
        SwitchOut::Dead
    } else if prev_state & 0xff == 0 {
        SwitchOut::Preempted
    } else {
        SwitchOut::Blocked
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
    /// only at a sleep inside it (see [`StateBuilder::blocked_syscall`])
    /// has its arguments, so this is true, but `start` is the sleep's.
    pub entry_seen: bool,
    pub exit_seen: bool,
}

/// Initial thread facts that are not events of their own: LTTng statedump
/// entries, `/proc` snapshots, or fork details a reader has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadInfo {
    pub tid: Tid,
    pub pid: Option<Tid>,
    pub ppid: Option<Tid>,
    pub name: Option<Comm>,
    /// What the thread was doing; applied only to a thread the model knows
    /// nothing about yet.
    pub status: Option<InitialStatus>,
}

/// Thread status as a statedump reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialStatus {
    /// Runnable, waiting for a CPU (also "just forked").
    WaitCpu,
    /// Waiting for something unknown.
    Wait,
    /// Running on some CPU.
    Run,
    /// Exited, zombie or dead.
    Gone,
    /// Any other status.
    Unknown,
}

impl ThreadInfo {
    /// Reads an `lttng_statedump_process_state` event's fields (`tid`,
    /// `pid`, `ppid`, `name`, `status`; LTTng's `lttng_process_status`
    /// numbering). `None` without a `tid`.
    pub fn from_lttng_statedump(fields: &Fields) -> Option<ThreadInfo> {
        let int = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| &**n == name)
                .and_then(|(_, v)| match v {
                    Value::Int(i) => Some(*i),
                    Value::UInt(u) => i64::try_from(*u).ok(),
                    Value::Str(s) => s.trim().parse().ok(),
                    _ => None,
                })
        };
        let tid = Tid::try_from(int("tid")?).ok()?;
        let name = fields
            .iter()
            .find(|(n, _)| &**n == "name")
            .and_then(|(_, v)| match v {
                Value::Str(s) => Some(Comm::from_bytes(s.as_bytes())),
                Value::Bytes(b) => Some(Comm::from_bytes(b)),
                _ => None,
            });
        let status = int("status").map(|s| match s {
            1 | 2 => InitialStatus::WaitCpu,
            5 => InitialStatus::Wait,
            6 => InitialStatus::Run,
            3 | 4 | 7 => InitialStatus::Gone,
            _ => InitialStatus::Unknown,
        });
        Some(ThreadInfo {
            tid,
            pid: int("pid").and_then(|p| Tid::try_from(p).ok()),
            ppid: int("ppid").and_then(|p| Tid::try_from(p).ok()),
            name,
            status,
        })
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
    states: Vec<StateInterval>,
    syscalls: Vec<SyscallInterval>,
    names: Vec<(u64, Comm)>,
    deaths: Vec<u64>,
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
    timeline: Vec<CpuInterval>,
    interrupts: Vec<InterruptInterval>,
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
    /// Events on a CPU number above [`MAX_CPUS`].
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
    /// Wake-ups by an interrupt that ran while a recorder thread was
    /// current (see [`StateBuilder::recorder_threads`]).
    pub wakeups_under_recorder: u64,
    /// Wake-ups recorded on one host's CPU in the context of another
    /// host's thread (see [`StateBuilder::hosts`]).
    pub wakeups_from_other_hosts: u64,
    /// Other events of that kind, left out.
    pub other_host_events: u64,
}

/// Builds a [`KernelModel`] from events pushed in time order.
///
/// ```
/// use deepspan_analysis::StateBuilder;
/// let mut b = StateBuilder::new();
/// // for event in events { b.push(&event); }
/// let model = b.finish();
/// assert!(model.threads().next().is_none());
/// ```
pub struct StateBuilder {
    threads: Vec<ThreadRec>,
    index: TidIndex,
    cpus: Vec<CpuRec>,
    graph: Graph,
    lost: Vec<LostRange>,
    irq_names: FastMap<i32, Name>,
    syscall_names: SyscallNames,
    waking_seen: bool,
    start: Option<u64>,
    last_ts: u64,
    stats: ModelStats,
    /// False: no execution graph (see [`StateBuilder::without_graph`]).
    graph_on: bool,
    /// False: interrupt handler runs are not kept (see
    /// [`StateBuilder::without_interrupt_history`]).
    interrupts_on: bool,
    /// False: the graph's rows end at their last event instead of at the
    /// end of the trace (see [`StateBuilder::open_ended`]).
    close_rows: bool,
    block_io: Vec<BlockIo>,
    packets: NetworkEnds,
    /// See [`StateBuilder::recorder_threads`].
    recorder_tids: Vec<Tid>,
    /// Names syscall numbers for traces without syscall names.
    arch: Arch,
    /// Packets a thread queued on a device, by skb address: who queued it,
    /// when, and on which device. A packet of the loopback device, or of
    /// a virtual pair (veth: the peer receives the very skb the other end
    /// queued), is received with the same address.
    local_in_flight: FastMap<u64, LocalPacket>,
    /// The host of each CPU, in a model of several hosts (empty: one).
    cpu_hosts: Vec<u32>,
    /// Recorded TCP segments sent and not yet received, by key: the
    /// sending context's vertex at the send, and when (see
    /// [`StateBuilder::segment`]).
    segments_in_flight: FastMap<u64, (VertexId, u64)>,
    /// True once the input has had a sleep in a system call (see
    /// [`StateBuilder::blocked_syscall`]): a thread's open call then ends
    /// when the thread runs again.
    switch_out_calls: bool,
    /// The names of recorded socket calls, `recv` and `send`, once
    /// interned (see [`StateBuilder::socket_call`]).
    socket_call_names: Option<[u16; 2]>,
}

/// A packet a thread queued, until its address is queued again.
#[derive(Clone)]
struct LocalPacket {
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
fn fresh_segment(c: &CpuRec, ts: u64) -> Option<u64> {
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

/// The tid of a host's kernel worker: the graph row of the work done in
/// interrupt context (Trace Compass' kernel worker).
pub const KERNEL_WORKER: Tid = -1;

struct ThreadRec {
    hist: ThreadHistory,
    open: Option<Open>,
    open_syscall: Option<SyscallInterval>,
    exiting: bool,
    /// Forked and not yet `sched_wakeup_new`: that wake-up is expected.
    forked: bool,
    pending_waking: Option<u64>,
    worker: u32,
}

#[derive(Clone, Copy)]
struct Open {
    start: u64,
    state: ThreadState,
    cpu: u32,
}

#[derive(Default)]
struct CpuRec {
    current: Option<Tid>,
    since: u64,
    seen: bool,
    last_ts: u64,
    timeline: Vec<CpuInterval>,
    interrupts: Vec<InterruptInterval>,
    stack: Vec<Frame>,
    /// A block request completed / a packet arrived in thread context since
    /// the last switch: that thread's wake-ups are I/O completions.
    thread_block: bool,
    thread_packet: bool,
    /// The key of the last message given to [`StateBuilder::packet`] as
    /// received in thread context since the last switch.
    thread_message: Option<u64>,
    /// The last recorded TCP segment received in thread context since the
    /// last switch (see [`StateBuilder::segment`]): key and time.
    thread_segment: Option<(u64, u64)>,
    /// The thread that queued a packet on the loopback device since the
    /// last switch (in thread context): a NET_RX softirq run in its
    /// context then delivers its packets.
    loopback_sender: Option<Tid>,
}

#[derive(Clone, Copy)]
struct Frame {
    kind: Interrupt,
    timer_ipi: bool,
    start: u64,
    block: bool,
    packet: bool,
    /// A packet of the loopback device, or one a local thread sent over a
    /// virtual pair, was received in this frame.
    loopback: bool,
    /// The thread that queued the last local packet received in this
    /// frame, matched by skb address: the frame's wake-ups deliver its
    /// data, whatever thread the softirq runs on (the sender's own,
    /// ksoftirqd's, or one whose events were filtered out).
    loopback_from: Option<Tid>,
    /// The key of the last message received in this frame.
    message: Option<u64>,
}

const NO_WORKER: u32 = u32::MAX;

/// Thread index lookup: a flat table for ordinary tids, a map for the rest.
#[derive(Default)]
struct TidIndex {
    flat: Vec<u32>,
    other: FastMap<Tid, u32>,
}

const FLAT_TIDS: usize = 1 << 22;

impl TidIndex {
    #[inline]
    fn get(&self, tid: Tid) -> Option<u32> {
        match usize::try_from(tid) {
            Ok(i) if i < FLAT_TIDS => self.flat.get(i).copied().filter(|&x| x != u32::MAX),
            _ => self.other.get(&tid).copied(),
        }
    }

    fn insert(&mut self, tid: Tid, idx: u32) {
        match usize::try_from(tid) {
            Ok(i) if i < FLAT_TIDS => {
                if self.flat.len() <= i {
                    self.flat
                        .resize((i + 1).next_power_of_two().min(FLAT_TIDS), u32::MAX);
                }
                self.flat[i] = idx;
            }
            _ => {
                self.other.insert(tid, idx);
            }
        }
    }
}

/// Interned syscall names. Readers share one [`Name`] per event name, so
/// the text's address is a cheap first key; every name seen is kept alive
/// so an address can never be reused for another name.
#[derive(Default)]
struct SyscallNames {
    names: Vec<Name>,
    by_text: FastMap<Name, u16>,
    by_ptr: FastMap<usize, u16>,
    keep: Vec<Name>,
    /// Entry and exit of one call share a name: a one-entry cache first.
    last: (usize, u16),
}

impl SyscallNames {
    #[inline]
    fn intern(&mut self, name: &Name) -> u16 {
        let ptr = name.as_ptr() as usize;
        if self.last.0 == ptr && ptr != 0 {
            return self.last.1;
        }
        let id = self.intern_slow(name, ptr);
        self.last = (ptr, id);
        id
    }

    fn intern_slow(&mut self, name: &Name, ptr: usize) -> u16 {
        if let Some(&id) = self.by_ptr.get(&ptr) {
            return id;
        }
        let id = match self.by_text.get(name) {
            Some(&id) => id,
            None => {
                if self.names.is_empty() {
                    self.names.push(Name::new(""));
                }
                let Ok(id) = u16::try_from(self.names.len()) else {
                    // Out of ids: unnamed (the number still says it).
                    return 0;
                };
                self.names.push(name.clone());
                self.by_text.insert(name.clone(), id);
                id
            }
        };
        self.keep.push(name.clone());
        self.by_ptr.insert(ptr, id);
        id
    }
}

enum Waker {
    Thread(Tid),
    Context(BlockReason),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum WakeKind {
    Waking,
    Wakeup,
    New,
}

impl Default for StateBuilder {
    fn default() -> Self {
        StateBuilder::new()
    }
}

impl StateBuilder {
    pub fn new() -> StateBuilder {
        StateBuilder {
            threads: Vec::new(),
            index: TidIndex::default(),
            cpus: Vec::new(),
            graph: Graph::new(),
            lost: Vec::new(),
            irq_names: FastMap::default(),
            syscall_names: SyscallNames::default(),
            waking_seen: false,
            start: None,
            last_ts: 0,
            stats: ModelStats::default(),
            graph_on: true,
            interrupts_on: true,
            close_rows: true,
            block_io: Vec::new(),
            packets: NetworkEnds::default(),
            recorder_tids: Vec::new(),
            arch: Arch::default(),
            local_in_flight: FastMap::default(),
            cpu_hosts: Vec::new(),
            segments_in_flight: FastMap::default(),
            switch_out_calls: false,
            socket_call_names: None,
        }
    }

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
    pub fn hosts(self, cpu_hosts: Vec<u32>) -> StateBuilder {
        StateBuilder { cpu_hosts, ..self }
    }

    /// Whether `tid` is current on `cpu` of another host (see
    /// [`StateBuilder::hosts`]).
    fn is_on_other_host(&self, cpu: u32, tid: Tid) -> bool {
        !self.cpu_hosts.is_empty()
            && tid > 0
            && self.cpu_hosts.get(cpu as usize) != Some(&split_host_tid(tid).0)
    }

    /// The threads whose events the recording filtered out (a deepspan
    /// recorder's own, `Manifest::recorder_tids`), and the architecture that
    /// numbers the trace's system calls.
    ///
    /// ftrace's pid filter also drops the interrupt events that run while a
    /// filtered thread is current, but keeps the wake-ups they cause: such a
    /// wake-up seems to come from the filtered thread. The recorder never
    /// wakes the threads it traces (it only reads the kernel's buffers), so
    /// those wake-ups are taken as interrupts: a timer's when the woken
    /// thread sleeps in `nanosleep`/`clock_nanosleep`, unexplained otherwise.
    pub fn recorder_threads(self, tids: &[Tid], arch: Arch) -> StateBuilder {
        StateBuilder {
            recorder_tids: tids.iter().copied().filter(|&t| t > 0).collect(),
            arch,
            ..self
        }
    }

    /// Leaves each graph row at its last event, as Trace Compass builds
    /// execution graphs, instead of extending every thread's last state to
    /// the end of the trace (the thread histories still end there); and
    /// begins a thread first seen at a wake-up there, instead of blocked
    /// since the trace began.
    pub fn open_ended(self) -> StateBuilder {
        StateBuilder {
            close_rows: false,
            ..self
        }
    }

    /// A network message sent or received now on `cpu`, identified by
    /// `key` (what matches its two ends: a TCP (seq, ack_seq, flags)
    /// digest, a test stub's message id). The context doing it gets a
    /// graph vertex: the current thread, or the host's kernel worker
    /// ([`KERNEL_WORKER`]) in interrupt context, running since the
    /// interrupt began. A send is kept as an end of the message; a
    /// reception makes the context's next wake-ups network wake-ups (no
    /// link from the waker), whose woken vertices are kept as the other
    /// end ([`KernelModel::network_ends`]).
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

    /// Thread `tid` went to sleep inside system call `nr`, whose first
    /// arguments were `args` (the recorder's switch-out capture,
    /// `kernel/blocked_syscalls.tsv`). For a trace recorded without the
    /// system-call events, this is what the thread waited in: it is in
    /// that call from the sleep until it next runs, and the rules that ask
    /// for the call of a blocked thread (a futex, a read on which fd, a
    /// sleep) read it as they read a traced one. The call's entry, exit
    /// and return value are not known: its interval starts at the sleep
    /// and has no return value, so the rules that need those (page-cache
    /// reads, the receive that places a span) find nothing in it. A thread
    /// that sleeps twice in one call has two intervals. A trace with the
    /// system-call events should not be given these: they would end its
    /// traced calls early.
    pub fn blocked_syscall(&mut self, ts: u64, tid: Tid, nr: i32, args: [u64; 3]) {
        if tid <= 0 {
            return;
        }
        let ts = self.clock(ts);
        self.switch_out_calls = true;
        let t = self.thread(tid);
        let th = &mut self.threads[t];
        if let Some(mut s) = th.open_syscall.take() {
            // It ran since its last sleep, but its switch-in was lost.
            s.end = ts.max(s.start);
            th.hist.syscalls.push(s);
        }
        th.open_syscall = Some(SyscallInterval {
            start: ts,
            end: ts,
            id: nr,
            name: 0,
            arg0: args[0],
            arg1: args[1],
            ret: 0,
            entry_seen: true,
            exit_seen: false,
        });
    }

    /// Thread `tid` received `bytes` from a socket or sent them on one
    /// (`sent`), as the recorder's socket-call capture saw it
    /// (`kernel/socket_calls.tsv`): `ts` is when the socket's protocol
    /// returned, the end of the call but for its return to user space.
    /// For a trace recorded without the system-call events, these are the
    /// receives and sends that place spans on threads: each is a call of
    /// no length named `recv` or `send` at `ts`; a receive carries its
    /// bytes as its return value, as a traced call's exit does. Like [`StateBuilder::blocked_syscall`],
    /// not for a trace with the system-call events.
    pub fn socket_call(&mut self, ts: u64, tid: Tid, sent: bool, bytes: u64) {
        if tid <= 0 {
            return;
        }
        let ts = self.clock(ts);
        let [recv, send] = *self.socket_call_names.get_or_insert_with(|| {
            let names = &mut self.syscall_names;
            [
                names.intern(&Name::new("recv")),
                names.intern(&Name::new("send")),
            ]
        });
        let t = self.thread(tid);
        let th = &mut self.threads[t];
        if let Some(mut s) = th.open_syscall.take() {
            // A call seen at its sleep: the thread runs again (its
            // switch-in was lost) and is in another call now.
            s.end = ts.max(s.start);
            th.hist.syscalls.push(s);
        }
        th.hist.syscalls.push(SyscallInterval {
            start: ts,
            end: ts,
            id: -1,
            name: if sent { send } else { recv },
            arg0: 0,
            arg1: 0,
            ret: if sent { 0 } else { bytes as i64 },
            entry_seen: false,
            exit_seen: !sent,
        });
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
    fn link_segment(&mut self, t: usize, ts: u64, key: u64) -> bool {
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
    fn name_network_edge(&mut self, t: usize, ts: u64, cpu: u32) {
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
    fn context_message(&self, cpu: u32, ts: u64) -> Option<u64> {
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

    /// A builder that keeps no execution graph: the model then has thread,
    /// CPU and system-call histories but no critical paths (they come out
    /// empty). For analyses without requests: a quarter less memory, and
    /// faster.
    pub fn without_graph() -> StateBuilder {
        StateBuilder {
            graph_on: false,
            ..StateBuilder::new()
        }
    }

    /// Keeps no history of interrupt handler runs
    /// ([`CpuHistory::interrupts`] comes out empty): nothing in the request
    /// analysis reads it (wake-up reasons come from the interrupt context
    /// at the time, which is still tracked), and on an interrupt-heavy
    /// trace it is a tenth of the model's memory.
    pub fn without_interrupt_history(self) -> StateBuilder {
        StateBuilder {
            interrupts_on: false,
            ..self
        }
    }

    /// Feeds one event. Events must come in time order; a timestamp that
    /// goes backwards is counted and treated as the latest time seen.
    pub fn push(&mut self, ev: &Event) {
        self.stats.events += 1;
        let ts = self.clock(ev.ts);
        if ev.cpu >= MAX_CPUS {
            self.stats.bad_cpu += 1;
            return;
        }
        let cpu = ev.cpu;
        self.cpu_mut(cpu).last_ts = ts;
        if !matches!(ev.kind, EventKind::SchedSwitch(_)) {
            if self.is_on_other_host(cpu, ev.tid) {
                match &ev.kind {
                    EventKind::SchedWaking(w) => self.wakeup(ts, cpu, ev.tid, w, WakeKind::Waking),
                    EventKind::SchedWakeup(w) => self.wakeup(ts, cpu, ev.tid, w, WakeKind::Wakeup),
                    _ => self.stats.other_host_events += 1,
                }
                return;
            }
            self.infer_current(cpu, ev.tid, ts);
        }
        match &ev.kind {
            EventKind::SchedSwitch(s) => self.sched_switch(ts, cpu, s),
            EventKind::SchedWaking(w) => self.wakeup(ts, cpu, ev.tid, w, WakeKind::Waking),
            EventKind::SchedWakeup(w) => self.wakeup(ts, cpu, ev.tid, w, WakeKind::Wakeup),
            EventKind::SchedWakeupNew(w) => self.wakeup(ts, cpu, ev.tid, w, WakeKind::New),
            EventKind::SchedProcessFork {
                parent_tid,
                parent_comm,
                child_tid,
                child_comm,
            } => self.fork(ts, *parent_tid, *parent_comm, *child_tid, *child_comm),
            EventKind::SchedProcessExec { tid, filename, .. } => {
                let base = filename.rsplit('/').next().unwrap_or(filename);
                let tid = if *tid > 0 {
                    *tid
                } else {
                    self.current(cpu).unwrap_or(0)
                };
                if tid > 0 {
                    let t = self.thread(tid);
                    self.set_name(
                        t,
                        ts,
                        Comm::from_bytes(&base.as_bytes()[..base.len().min(15)]),
                    );
                }
            }
            EventKind::SchedProcessExit { tid, comm, .. } if *tid > 0 => {
                let t = self.thread(*tid);
                self.set_name(t, ts, *comm);
                self.threads[t].exiting = true;
            }
            EventKind::SchedProcessFree { tid, .. } => {
                if let Some(t) = self.index.get(*tid) {
                    if self.threads[t as usize].open.is_some() {
                        self.die(t as usize, ts);
                    }
                }
            }
            EventKind::SchedMigrateTask { tid, dest_cpu, .. } => self.migrate(ts, *tid, *dest_cpu),
            EventKind::IrqHandlerEntry { irq, name } => {
                if self.irq_names.get(irq) != Some(name) {
                    self.irq_names.insert(*irq, name.clone());
                }
                self.enter(cpu, ts, Interrupt::Irq(*irq), false);
            }
            EventKind::IrqHandlerExit { irq, .. } => {
                self.exit(cpu, ts, |k| k == Interrupt::Irq(*irq))
            }
            EventKind::SoftirqEntry { vec } => self.enter(cpu, ts, Interrupt::Softirq(*vec), false),
            EventKind::SoftirqExit { vec } => self.exit(cpu, ts, |k| k == Interrupt::Softirq(*vec)),
            EventKind::HrtimerExpireEntry { .. } => self.enter(cpu, ts, Interrupt::Hrtimer, false),
            EventKind::HrtimerExpireExit { .. } => self.exit(cpu, ts, |k| k == Interrupt::Hrtimer),
            EventKind::IpiEntry { kind, .. } => {
                let timer = kind
                    .as_bytes()
                    .windows(5)
                    .any(|w| w.eq_ignore_ascii_case(b"timer"));
                self.enter(cpu, ts, Interrupt::Ipi, timer)
            }
            EventKind::IpiExit { .. } => self.exit(cpu, ts, |k| k == Interrupt::Ipi),
            EventKind::SysEnter { id, name, args } => {
                self.sys_enter(ts, cpu, *id, name.as_ref(), args)
            }
            EventKind::SysExit { id, name, ret } => {
                self.sys_exit(ts, cpu, *id, name.as_ref(), *ret)
            }
            EventKind::BlockRqInsert(rq) => self.block_io(ts, ev.tid, BlockPhase::Insert, rq),
            EventKind::BlockRqIssue(rq) => self.block_io(ts, ev.tid, BlockPhase::Issue, rq),
            EventKind::BlockRqComplete(rq) => {
                self.block_io(ts, ev.tid, BlockPhase::Complete, rq);
                let c = self.cpu_mut(cpu);
                match c.stack.last_mut() {
                    Some(f) => f.block = true,
                    None => c.thread_block = true,
                }
            }
            EventKind::NetifReceiveSkb(p) => {
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
            EventKind::NetDevQueue(p) => {
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
            _ => {}
        }
    }

    /// Records that events were lost on `cpu` before `ts` (since the CPU's
    /// previous event). The interrupt nesting of that CPU is forgotten, as
    /// its exits may be among the lost events.
    pub fn lost(&mut self, cpu: u32, ts: u64) {
        self.stats.lost_markers += 1;
        if cpu >= MAX_CPUS {
            self.stats.bad_cpu += 1;
            return;
        }
        let begin = self.start.unwrap_or(ts);
        let c = self.cpu_mut(cpu);
        let start = if c.seen { c.last_ts } else { begin }.min(ts);
        self.lost.push(LostRange {
            start,
            end: ts,
            cpu,
        });
        let keep = self.interrupts_on;
        let c = self.cpu_mut(cpu);
        let frames = std::mem::take(&mut c.stack);
        let end = ts.max(c.last_ts);
        for (depth, f) in frames.iter().enumerate().filter(|_| keep) {
            c.interrupts.push(InterruptInterval {
                start: f.start,
                end,
                kind: f.kind,
                depth: depth as u8,
            });
        }
    }

    /// Feeds thread facts that are not events (statedump, `/proc`): ids and
    /// name are recorded; the status sets the initial state of a thread the
    /// model knows nothing about yet.
    pub fn thread_info(&mut self, ts: u64, info: &ThreadInfo) {
        if info.tid <= 0 {
            return;
        }
        let ts = self.clock(ts);
        let t = self.thread(info.tid);
        if let Some(name) = info.name {
            self.set_name(t, ts, name);
        }
        let th = &mut self.threads[t];
        if info.pid.is_some() {
            th.hist.pid = info.pid;
        }
        if info.ppid.is_some() {
            th.hist.ppid = info.ppid;
        }
        let fresh = th.open.is_none() && th.hist.states.is_empty() && th.hist.deaths.is_empty();
        let initial = match info.status {
            Some(InitialStatus::WaitCpu) => Some(ThreadState::WaitCpu),
            Some(InitialStatus::Wait | InitialStatus::Run | InitialStatus::Unknown) => {
                Some(ThreadState::Unknown)
            }
            Some(InitialStatus::Gone) | None => None,
        };
        if let (true, Some(state)) = (fresh, initial) {
            self.transition(t, ts, state, NO_CPU);
        }
    }

    /// Closes every open interval at the last event's time and returns the
    /// model.
    pub fn finish(mut self) -> KernelModel {
        let end = self.last_ts;
        let start = self.start.unwrap_or(0);
        for t in 0..self.threads.len() {
            let th = &mut self.threads[t];
            if let Some(mut s) = th.open_syscall.take() {
                s.end = end.max(s.start);
                th.hist.syscalls.push(s);
            }
            if let Some(open) = th.open.take() {
                // The last state is kept even when it just began: it is
                // what the thread is doing at the end.
                th.hist.states.push(StateInterval {
                    start: open.start,
                    end: end.max(open.start),
                    state: open.state,
                    cpu: open.cpu,
                });
                if th.worker != NO_WORKER && self.close_rows {
                    let q = self.qualifier(open.state);
                    let q = q.as_deref();
                    self.graph
                        .append(self.threads[t].worker, end, open.state.edge_type(), q);
                }
            }
        }
        let mut cpus = Vec::with_capacity(self.cpus.len());
        for (n, mut c) in self.cpus.into_iter().enumerate() {
            if let Some(tid) = c.current {
                // Kept even when it just began: who is on the CPU at the end.
                c.timeline.push(CpuInterval {
                    start: c.since,
                    end: end.max(c.since),
                    tid,
                });
            }
            for (depth, f) in c.stack.iter().enumerate().filter(|_| self.interrupts_on) {
                c.interrupts.push(InterruptInterval {
                    start: f.start,
                    end,
                    kind: f.kind,
                    depth: depth as u8,
                });
            }
            cpus.push(CpuHistory {
                cpu: n as u32,
                timeline: c.timeline,
                interrupts: c.interrupts,
            });
        }
        let mut index = FastMap::default();
        let threads: Vec<ThreadHistory> = self
            .threads
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                index.insert(t.hist.tid, i);
                t.hist
            })
            .collect();
        let mut lost = self.lost;
        lost.sort();
        let mut names = self.syscall_names.names;
        if names.is_empty() {
            names.push(Name::new(""));
        }
        KernelModel {
            threads,
            index,
            cpus,
            graph: self.graph,
            lost,
            irq_names: self.irq_names,
            syscall_names: names,
            stats: self.stats,
            start,
            end,
            block_io: self.block_io,
            packets: self.packets,
            held_back: HeldBack::default(),
        }
    }

    fn block_io(&mut self, ts: u64, tid: Tid, phase: BlockPhase, rq: &BlockRq) {
        self.block_io.push(BlockIo {
            ts,
            phase,
            dev: rq.dev,
            sector: rq.sector,
            nr_sector: rq.nr_sector,
            write: rq.rwbs.contains(&b'W'),
            tid,
        });
    }

    fn clock(&mut self, ts: u64) -> u64 {
        if self.start.is_none() {
            self.start = Some(ts);
        }
        if ts < self.last_ts {
            self.stats.out_of_order += 1;
            return self.last_ts;
        }
        self.last_ts = ts;
        ts
    }

    fn cpu_mut(&mut self, cpu: u32) -> &mut CpuRec {
        let i = cpu as usize;
        if self.cpus.len() <= i {
            self.cpus.resize_with(i + 1, CpuRec::default);
        }
        let c = &mut self.cpus[i];
        c.seen = true;
        c
    }

    fn current(&self, cpu: u32) -> Option<Tid> {
        self.cpus.get(cpu as usize).and_then(|c| c.current)
    }

    /// Index of `tid`'s record, created on first sight.
    #[inline]
    fn thread(&mut self, tid: Tid) -> usize {
        match self.index.get(tid) {
            Some(i) => i as usize,
            None => self.new_thread(tid),
        }
    }

    /// Kept out of line: building a record takes a large stack frame, which
    /// the lookup of a known thread (nearly every event) would otherwise
    /// set up and tear down every time.
    #[cold]
    #[inline(never)]
    fn new_thread(&mut self, tid: Tid) -> usize {
        let i = self.threads.len();
        self.threads.push(ThreadRec {
            hist: ThreadHistory {
                tid,
                ..ThreadHistory::default()
            },
            open: None,
            open_syscall: None,
            exiting: false,
            forked: false,
            pending_waking: None,
            worker: NO_WORKER,
        });
        self.index.insert(tid, i as u32);
        i
    }

    fn set_name(&mut self, t: usize, ts: u64, name: Comm) {
        if name.as_bytes().is_empty() {
            return;
        }
        let names = &mut self.threads[t].hist.names;
        if names.last().is_none_or(|n| n.1 != name) {
            names.push((ts, name));
        }
    }

    /// The reader's `tid` (the thread current on the CPU when the event
    /// fired, interrupted or not) says who runs on a CPU: on one the model
    /// has not seen a `sched_switch` on yet, or — when it contradicts the
    /// model — on one whose switch was missed (lost, or never written: some
    /// recordings lack switches out of the idle task). The switch is then
    /// taken to happen at this event: the earliest time known for it.
    fn infer_current(&mut self, cpu: u32, tid: Tid, ts: u64) {
        if tid < 0 {
            return;
        }
        let current = self.cpus.get(cpu as usize).and_then(|c| c.current);
        if current == Some(tid) {
            return;
        }
        if let Some(prev) = current {
            self.stats.inferred_switches += 1;
            if let Some(t) = self.index.get(prev).map(|t| t as usize) {
                if self.threads[t]
                    .open
                    .is_some_and(|o| o.state == ThreadState::Running && o.cpu == cpu)
                {
                    // How it left the CPU is not known.
                    self.transition(t, ts, ThreadState::Unknown, NO_CPU);
                }
            }
            let c = self.cpu_mut(cpu);
            if ts > c.since {
                c.timeline.push(CpuInterval {
                    start: c.since,
                    end: ts,
                    tid: prev,
                });
            }
            c.thread_block = false;
            c.thread_packet = false;
            c.thread_message = None;
            c.thread_segment = None;
            c.loopback_sender = None;
        }
        let c = self.cpu_mut(cpu);
        c.current = Some(tid);
        c.since = ts;
        if tid > 0 {
            let t = self.thread(tid);
            let running_elsewhere = self.threads[t].open.is_some_and(|o| {
                o.state == ThreadState::Running && o.cpu != cpu && o.cpu != NO_CPU
            });
            if !running_elsewhere {
                self.transition(t, ts, ThreadState::Running, cpu);
            }
        }
    }

    /// Moves thread `t` to `state` at `ts`, closing the previous interval and
    /// extending the graph (a vertex only where the edge type changes).
    fn transition(&mut self, t: usize, ts: u64, state: ThreadState, cpu: u32) {
        let old = self.threads[t].open;
        if self.switch_out_calls
            && state == ThreadState::Running
            && old.is_none_or(|o| o.state != ThreadState::Running)
        {
            // A call seen only at its sleep ends when the thread runs again
            // (its exit follows at once).
            let th = &mut self.threads[t];
            if let Some(mut s) = th.open_syscall.take() {
                s.end = ts.max(s.start);
                th.hist.syscalls.push(s);
            }
        }
        if let Some(o) = old {
            if o.state == state && o.cpu == cpu {
                return;
            }
            if ts > o.start {
                self.threads[t].hist.states.push(StateInterval {
                    start: o.start,
                    end: ts,
                    state: o.state,
                    cpu: o.cpu,
                });
            }
        }
        if self.graph_on {
            let worker = self.worker(t);
            match old {
                Some(o) => {
                    let same_edge = o.state.edge_type() == state.edge_type()
                        && self.qualifier(o.state) == self.qualifier(state);
                    if !same_edge {
                        let q = self.qualifier(o.state);
                        self.graph
                            .append(worker, ts, o.state.edge_type(), q.as_deref());
                    }
                }
                None => {
                    self.graph.add(worker, ts);
                }
            }
        }
        self.threads[t].open = Some(Open {
            start: ts,
            state,
            cpu,
        });
    }

    /// The graph row of thread `t`.
    fn worker(&mut self, t: usize) -> u32 {
        let th = &mut self.threads[t];
        if th.worker == NO_WORKER {
            th.worker = self.graph.worker(th.hist.tid);
        }
        th.worker
    }

    /// A vertex of thread `t` at `ts`, splitting its current graph edge
    /// (the state interval stays whole).
    fn vertex_now(&mut self, t: usize, ts: u64) -> VertexId {
        let worker = self.worker(t);
        match self.threads[t].open {
            Some(o) => {
                let q = self.qualifier(o.state);
                self.graph
                    .append(worker, ts, o.state.edge_type(), q.as_deref())
            }
            None => self.graph.add(worker, ts),
        }
    }

    fn qualifier(&self, state: ThreadState) -> Option<Name> {
        static SOFTIRQS: OnceLock<Vec<Name>> = OnceLock::new();
        match state {
            ThreadState::Blocked(BlockReason::Irq(irq)) => Some(
                self.irq_names
                    .get(&irq)
                    .cloned()
                    .unwrap_or_else(|| Name::new(&format!("irq {irq}"))),
            ),
            ThreadState::Blocked(BlockReason::Softirq(v)) => {
                let names = SOFTIRQS.get_or_init(|| {
                    (0..=softirq::RCU + 1)
                        .map(|v| Name::new(softirq_name(v)))
                        .collect()
                });
                Some(names[(v as usize).min(names.len() - 1)].clone())
            }
            _ => None,
        }
    }

    fn die(&mut self, t: usize, ts: u64) {
        if let Some(o) = self.threads[t].open.take() {
            if ts > o.start {
                self.threads[t].hist.states.push(StateInterval {
                    start: o.start,
                    end: ts,
                    state: o.state,
                    cpu: o.cpu,
                });
            }
            if self.graph_on {
                let q = self.qualifier(o.state);
                let worker = self.worker(t);
                self.graph
                    .append(worker, ts, o.state.edge_type(), q.as_deref());
            }
        }
        let th = &mut self.threads[t];
        if let Some(mut s) = th.open_syscall.take() {
            s.end = ts.max(s.start);
            th.hist.syscalls.push(s);
        }
        th.hist.deaths.push(ts);
        th.exiting = false;
        th.forked = false;
        th.pending_waking = None;
    }

    fn sched_switch(&mut self, ts: u64, cpu: u32, s: &SchedSwitch) {
        // A different thread than the one switched out was thought to run
        // here: its own switch-out was lost.
        if let Some(cur) = self.current(cpu) {
            if cur != s.prev_tid {
                self.stats.inconsistencies += 1;
                if let Some(t) = self.index.get(cur).map(|t| t as usize) {
                    if self.threads[t]
                        .open
                        .is_some_and(|o| o.state == ThreadState::Running && o.cpu == cpu)
                    {
                        self.transition(t, ts, ThreadState::Unknown, NO_CPU);
                    }
                }
            }
        }
        if s.prev_tid > 0 {
            let t = self.thread(s.prev_tid);
            self.set_name(t, ts, s.prev_comm);
            let th = &mut self.threads[t];
            let pending = th
                .pending_waking
                .take()
                .filter(|&p| ts.saturating_sub(p) <= PENDING_WAKING_WINDOW_NS);
            match switch_out(s.prev_state, th.exiting) {
                SwitchOut::Preempted => self.transition(t, ts, ThreadState::Preempted, cpu),
                SwitchOut::Dead => self.die(t, ts),
                SwitchOut::Blocked if pending.is_some() => {
                    self.stats.early_wakings_used += 1;
                    self.transition(t, ts, ThreadState::WaitCpu, cpu)
                }
                SwitchOut::Blocked => {
                    self.transition(t, ts, ThreadState::Blocked(BlockReason::Unexplained), cpu)
                }
            }
        }
        if s.next_tid > 0 {
            let t = self.thread(s.next_tid);
            self.set_name(t, ts, s.next_comm);
            self.threads[t].pending_waking = None;
            self.threads[t].forked = false;
            self.transition(t, ts, ThreadState::Running, cpu);
        }
        let c = self.cpu_mut(cpu);
        if let Some(prev) = c.current {
            if ts > c.since {
                c.timeline.push(CpuInterval {
                    start: c.since,
                    end: ts,
                    tid: prev,
                });
            }
        }
        c.current = Some(s.next_tid);
        c.since = ts;
        c.thread_block = false;
        c.thread_packet = false;
        c.thread_message = None;
        c.thread_segment = None;
        c.loopback_sender = None;
    }

    /// The thread whose loopback packet wakes a thread from `cpu` now: in
    /// a NET_RX softirq that received a loopback packet, the thread that
    /// queued that packet (matched by skb address), else the thread the
    /// softirq interrupted right after it queued packets on `lo`.
    fn loopback_sender(&self, cpu: u32) -> Option<Tid> {
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

    /// Who (or what) wakes a thread from `cpu` now.
    fn waker(&self, cpu: u32, ev_tid: Tid) -> Waker {
        if self.is_on_other_host(cpu, ev_tid) {
            return Waker::Context(BlockReason::PacketFrom(ev_tid));
        }
        let Some(c) = self.cpus.get(cpu as usize) else {
            return Waker::Context(BlockReason::Unexplained);
        };
        if let Some(f) = c.stack.last() {
            return Waker::Context(self.frame_reason(f));
        }
        if c.thread_block {
            return Waker::Context(BlockReason::BlockDevice);
        }
        if c.thread_packet {
            return Waker::Context(BlockReason::Network);
        }
        match c.current.or((ev_tid >= 0).then_some(ev_tid)) {
            Some(tid) if tid > 0 => Waker::Thread(tid),
            _ => Waker::Context(BlockReason::Unexplained),
        }
    }

    /// Whether thread `t` may be waiting for a packet: blocked in a system
    /// call that waits on sockets or file descriptors (or in one the trace
    /// does not show). A sleep, a futex or a child's exit is not ended by
    /// a segment that arrived on the CPU meanwhile.
    fn may_wait_for_network(&self, t: usize) -> bool {
        let Some(call) = &self.threads[t].open_syscall else {
            return true;
        };
        let name = match call.name {
            0 => syscall_name(self.arch, call.id),
            n => self.syscall_names.names.get(n as usize).map(|n| &**n),
        };
        match name {
            None => true,
            Some(name) => matches!(
                name,
                "read"
                    | "readv"
                    | "recvfrom"
                    | "recvmsg"
                    | "recvmmsg"
                    | "write"
                    | "writev"
                    | "sendto"
                    | "sendmsg"
                    | "sendmmsg"
                    | "accept"
                    | "accept4"
                    | "connect"
                    | "poll"
                    | "ppoll"
                    | "select"
                    | "pselect6"
                    | "epoll_wait"
                    | "epoll_pwait"
                    | "epoll_pwait2"
                    | "io_uring_enter"
                    | "splice"
                    | "sendfile"
                    | "sendfile64"
            ),
        }
    }

    /// Why an interrupt whose events the trace lacks woke thread `t`: see
    /// [`StateBuilder::recorder_threads`].
    fn hidden_interrupt_reason(&self, t: usize) -> BlockReason {
        let Some(call) = &self.threads[t].open_syscall else {
            return BlockReason::Unexplained;
        };
        let name = match call.name {
            0 => syscall_name(self.arch, call.id),
            n => self.syscall_names.names.get(n as usize).map(|n| &**n),
        };
        match name {
            Some("nanosleep" | "clock_nanosleep" | "clock_nanosleep_time64") => BlockReason::Timer,
            _ => BlockReason::Unexplained,
        }
    }

    fn frame_reason(&self, f: &Frame) -> BlockReason {
        let by_flags = || {
            if f.block {
                Some(BlockReason::BlockDevice)
            } else if f.packet {
                Some(BlockReason::Network)
            } else {
                None
            }
        };
        match f.kind {
            Interrupt::Hrtimer => BlockReason::Timer,
            Interrupt::Ipi if f.timer_ipi => BlockReason::Timer,
            Interrupt::Ipi => BlockReason::Ipi,
            Interrupt::Softirq(v) => match v {
                softirq::TIMER | softirq::HRTIMER => BlockReason::Timer,
                softirq::BLOCK | softirq::IRQ_POLL => BlockReason::BlockDevice,
                softirq::NET_RX | softirq::NET_TX => BlockReason::Network,
                softirq::SCHED => BlockReason::Interrupted,
                _ => by_flags().unwrap_or(BlockReason::Softirq(v)),
            },
            Interrupt::Irq(irq) => by_flags().unwrap_or_else(|| {
                if irq == 0 {
                    BlockReason::Interrupted
                } else if self.irq_names.get(&irq).is_some_and(|n| is_input_device(n)) {
                    BlockReason::UserInput
                } else {
                    BlockReason::Irq(irq)
                }
            }),
        }
    }

    fn wakeup(&mut self, ts: u64, cpu: u32, ev_tid: Tid, w: &Wakeup, kind: WakeKind) {
        match kind {
            WakeKind::Waking => self.waking_seen = true,
            WakeKind::Wakeup if self.waking_seen => {
                // The waking already handled it; a wake-up of a thread still
                // running means it will not block after all.
                self.stats.wakeups_superseded += 1;
                if let Some(t) = self.index.get(w.tid) {
                    let th = &mut self.threads[t as usize];
                    if th.open.is_some_and(|o| o.state == ThreadState::Running) {
                        th.pending_waking = None;
                    }
                }
                return;
            }
            _ => {}
        }
        if w.tid <= 0 {
            return;
        }
        let t = self.thread(w.tid);
        self.set_name(t, ts, w.comm);
        let target_cpu = u32::try_from(w.target_cpu)
            .ok()
            .filter(|&c| c < MAX_CPUS)
            .unwrap_or(NO_CPU);
        let mut waker = self.waker(cpu, ev_tid);
        // A segment received on this CPU outside a frame just before, and
        // a thread waiting for I/O: the segment's wake-up (see `segment`).
        if matches!(
            waker,
            Waker::Thread(_) | Waker::Context(BlockReason::Unexplained)
        ) && self
            .cpus
            .get(cpu as usize)
            .and_then(|c| fresh_segment(c, ts))
            .is_some()
            && self.may_wait_for_network(t)
        {
            waker = Waker::Context(BlockReason::Network);
        }
        if matches!(waker, Waker::Context(BlockReason::PacketFrom(x)) if x == ev_tid)
            && self.is_on_other_host(cpu, ev_tid)
        {
            self.stats.wakeups_from_other_hosts += 1;
        }
        if matches!(waker, Waker::Thread(x) if self.recorder_tids.contains(&x)) {
            self.stats.wakeups_under_recorder += 1;
            waker = Waker::Context(self.hidden_interrupt_reason(t));
        }
        if matches!(waker, Waker::Context(BlockReason::Network)) {
            if let Some(sender) = self.loopback_sender(cpu).filter(|&x| x != w.tid) {
                waker = Waker::Context(BlockReason::PacketFrom(sender));
            }
        }
        if matches!(waker, Waker::Thread(x) if x == w.tid) {
            self.stats.spurious_wakeups += 1;
            return;
        }
        if self.threads[t].open.is_none() && kind != WakeKind::New && self.close_rows {
            // First sight at a wake-up: the kernel wakes only sleeping
            // tasks, so it slept since the trace began (or since its tid's
            // last life ended), and the waker ended that sleep. A thread
            // blocked since before a snapshot's window is seen first here;
            // without the wait and its edge a chain of waits would stop.
            let h = &self.threads[t].hist;
            let since = [
                self.start,
                h.states.last().map(|s| s.end),
                h.deaths.last().copied(),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(ts)
            .min(ts);
            if since < ts {
                self.transition(
                    t,
                    since,
                    ThreadState::Blocked(BlockReason::Unexplained),
                    NO_CPU,
                );
            }
        }
        let open = self.threads[t].open;
        match open.map(|o| o.state) {
            None => {
                // A fork child's first wake-up (or a first sight at the
                // trace's first instant).
                self.transition(t, ts, ThreadState::WaitCpu, target_cpu);
                if let (WakeKind::New, Waker::Thread(x)) = (kind, waker) {
                    self.link(x, t, ts);
                }
            }
            Some(ThreadState::Running) => {
                let running_cpu = open.map_or(NO_CPU, |o| o.cpu);
                if kind == WakeKind::Waking && running_cpu != cpu {
                    self.threads[t].pending_waking = Some(ts);
                }
                self.stats.spurious_wakeups += 1;
            }
            Some(ThreadState::Preempted | ThreadState::WaitCpu) => {
                if kind == WakeKind::New && self.threads[t].forked {
                    // The expected wake-up of a fork child says its run queue.
                    self.threads[t].forked = false;
                    if target_cpu != NO_CPU {
                        self.transition(t, ts, ThreadState::WaitCpu, target_cpu);
                    }
                } else {
                    self.stats.spurious_wakeups += 1;
                }
            }
            Some(ThreadState::Unknown) => self.transition(t, ts, ThreadState::WaitCpu, target_cpu),
            Some(ThreadState::Blocked(_)) => {
                let reason = match waker {
                    Waker::Thread(x) => BlockReason::Thread(x),
                    Waker::Context(r) => r,
                };
                if let Some(o) = self.threads[t].open.as_mut() {
                    o.state = ThreadState::Blocked(reason);
                }
                if reason == BlockReason::Network {
                    self.name_network_edge(t, ts, cpu);
                }
                self.transition(t, ts, ThreadState::WaitCpu, target_cpu);
                if let Waker::Thread(x) | Waker::Context(BlockReason::PacketFrom(x)) = waker {
                    self.link(x, t, ts);
                }
                if let (Waker::Context(BlockReason::Network), Some(key)) =
                    (waker, self.context_message(cpu, ts))
                {
                    if self.graph_on && !self.link_segment(t, ts, key) {
                        let v = self.vertex_now(t, ts);
                        self.packets.received.push((key, v));
                    }
                }
            }
        }
    }

    /// A wake-up or fork edge from thread `from` to thread record `to` at
    /// `ts`.
    fn link(&mut self, from: Tid, to: usize, ts: u64) {
        if !self.graph_on {
            return;
        }
        let f = self.thread(from);
        let vf = self.vertex_now(f, ts);
        let vt = self.vertex_now(to, ts);
        self.graph.link(vf, vt, EdgeType::Default, None);
    }

    fn fork(&mut self, ts: u64, parent: Tid, parent_comm: Comm, child: Tid, child_comm: Comm) {
        if child <= 0 {
            return;
        }
        let c = self.thread(child);
        if self.threads[c].open.is_some() {
            // The tid is reused: the previous thread is gone.
            self.die(c, ts);
        }
        self.set_name(c, ts, child_comm);
        self.threads[c].forked = true;
        self.threads[c].hist.parent = (parent > 0).then_some(parent);
        self.transition(c, ts, ThreadState::WaitCpu, NO_CPU);
        if parent > 0 {
            let p = self.thread(parent);
            self.set_name(p, ts, parent_comm);
            self.link(parent, c, ts);
        }
    }

    fn migrate(&mut self, ts: u64, tid: Tid, dest: i32) {
        let Some(t) = self.index.get(tid).map(|t| t as usize) else {
            return;
        };
        let Ok(dest) = u32::try_from(dest) else {
            return;
        };
        if let Some(o) = self.threads[t].open {
            if o.state.is_runnable() && o.cpu != dest {
                self.transition(t, ts, o.state, dest);
            }
        }
    }

    fn enter(&mut self, cpu: u32, ts: u64, kind: Interrupt, timer_ipi: bool) {
        let keep = self.interrupts_on;
        let c = self.cpu_mut(cpu);
        if c.stack.len() >= MAX_NESTING {
            let f = c.stack.remove(0);
            if keep {
                c.interrupts.push(InterruptInterval {
                    start: f.start,
                    end: ts,
                    kind: f.kind,
                    depth: 0,
                });
            }
        }
        c.stack.push(Frame {
            kind,
            timer_ipi,
            start: ts,
            block: false,
            packet: false,
            loopback: false,
            loopback_from: None,
            message: None,
        });
    }

    fn exit(&mut self, cpu: u32, ts: u64, matches: impl Fn(Interrupt) -> bool) {
        let keep = self.interrupts_on;
        let c = self.cpu_mut(cpu);
        let Some(pos) = c.stack.iter().rposition(|f| matches(f.kind)) else {
            self.stats.unmatched_exits += 1;
            return;
        };
        // Frames above the matching one lost their exits: they end here too.
        while c.stack.len() > pos {
            let depth = c.stack.len() - 1;
            let popped = c.stack.pop();
            if let Some(f) = popped.filter(|_| keep) {
                c.interrupts.push(InterruptInterval {
                    start: f.start,
                    end: ts,
                    kind: f.kind,
                    depth: depth as u8,
                });
            }
        }
    }

    /// The thread in thread context on `cpu` (a system call's caller).
    fn caller(&mut self, cpu: u32) -> Option<usize> {
        let tid = self.current(cpu).filter(|&t| t > 0)?;
        Some(self.thread(tid))
    }

    fn sys_enter(&mut self, ts: u64, cpu: u32, id: i64, name: Option<&Name>, args: &[u64; 6]) {
        let Some(t) = self.caller(cpu) else { return };
        let name = name.map_or(0, |n| self.syscall_names.intern(n));
        let th = &mut self.threads[t];
        th.pending_waking = None;
        if let Some(mut s) = th.open_syscall.take() {
            // Its exit was lost.
            s.end = ts;
            th.hist.syscalls.push(s);
        }
        th.open_syscall = Some(SyscallInterval {
            start: ts,
            end: ts,
            id: i32::try_from(id).unwrap_or(-1),
            name,
            arg0: args[0],
            arg1: args[1],
            ret: 0,
            entry_seen: true,
            exit_seen: false,
        });
    }

    fn sys_exit(&mut self, ts: u64, cpu: u32, id: i64, name: Option<&Name>, ret: i64) {
        let Some(t) = self.caller(cpu) else { return };
        let name = name.map_or(0, |n| self.syscall_names.intern(n));
        let id = i32::try_from(id).unwrap_or(-1);
        let th = &mut self.threads[t];
        th.pending_waking = None;
        let s = match th.open_syscall.take() {
            Some(mut s) => {
                s.end = ts;
                s.ret = ret;
                s.exit_seen = true;
                if s.id < 0 {
                    s.id = id;
                }
                if s.name == 0 {
                    s.name = name;
                }
                s
            }
            None => {
                // Entered before we could see it: it began no later than the
                // end of the previous call or the thread's first sight.
                let after_prev = th.hist.syscalls.last().map(|p| p.end);
                let first = th
                    .hist
                    .states
                    .first()
                    .map(|s| s.start)
                    .or(th.open.map(|o| o.start));
                let start = after_prev.or(first).unwrap_or(ts).min(ts);
                SyscallInterval {
                    start,
                    end: ts,
                    id,
                    name,
                    arg0: 0,
                    arg1: 0,
                    ret,
                    entry_seen: false,
                    exit_seen: true,
                }
            }
        };
        th.hist.syscalls.push(s);
    }
}

fn is_input_device(name: &str) -> bool {
    const INPUT: [&str; 10] = [
        "i8042", "keyboard", "kbd", "mouse", "evdev", "input", "hid", "tty", "serial", "touch",
    ];
    let lower = name.to_ascii_lowercase();
    INPUT.iter().any(|k| lower.contains(k))
}

/// The result of the state model: per-thread and per-CPU histories, the
/// execution graph, and what was lost.
#[derive(Clone, Debug)]
pub struct KernelModel {
    threads: Vec<ThreadHistory>,
    index: FastMap<Tid, usize>,
    cpus: Vec<CpuHistory>,
    graph: Graph,
    lost: Vec<LostRange>,
    irq_names: FastMap<i32, Name>,
    syscall_names: Vec<Name>,
    stats: ModelStats,
    start: u64,
    end: u64,
    block_io: Vec<BlockIo>,
    packets: NetworkEnds,
    held_back: HeldBack,
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

    /// The graph vertices where messages given to
    /// [`StateBuilder::packet`] left and woke threads.
    pub fn network_ends(&self) -> &NetworkEnds {
        &self.packets
    }

    /// Block-layer request events (`block_rq_insert`/`issue`/`complete`),
    /// in time order.
    pub fn block_io(&self) -> &[BlockIo] {
        &self.block_io
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
    fn switch_out_encodings() {
        assert_eq!(switch_out(0, false), SwitchOut::Preempted);
        assert_eq!(switch_out(0x100, false), SwitchOut::Preempted); // TASK_REPORT_MAX, "R+"
        assert_eq!(switch_out(2048, false), SwitchOut::Preempted); // old TASK_STATE_MAX
        assert_eq!(switch_out(1, false), SwitchOut::Blocked);
        assert_eq!(switch_out(2, false), SwitchOut::Blocked);
        assert_eq!(switch_out(0x80, false), SwitchOut::Blocked); // idle kthread ("I")
        assert_eq!(switch_out(0x20, false), SwitchOut::Dead); // zombie
        assert_eq!(switch_out(64, true), SwitchOut::Dead);
    }

    #[test]
    fn query_helpers_use_closed_ranges() {
        let v = [(0u64, 10u64), (10, 20), (25, 30)];
        assert_eq!(overlapping(&v, 10, 10, |x| *x), &v[0..2]);
        assert_eq!(overlapping(&v, 21, 24, |x| *x), &[] as &[(u64, u64)]);
        assert_eq!(at(&v, 10, |x| *x), Some(&(10, 20)));
        assert_eq!(at(&v, 22, |x| *x), None);
    }
}
