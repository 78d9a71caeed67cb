//! The state model's single pass: [`StateBuilder`] takes events in time
//! order, one handler per kind (scheduling, wake-ups, forks, interrupts,
//! system calls, block I/O, lost events, thread facts), and keeps what
//! the pass needs meanwhile: each thread's open state and call, each
//! CPU's current thread and interrupt nesting, and the execution graph
//! as it grows. [`StateBuilder::finish`] closes what is open and hands
//! over the [`KernelModel`].
//!
//! The handlers for packets and segments, and the matching of a message's
//! two ends, are in `network`; those about models of several hosts in
//! `hosts`.

use std::sync::OnceLock;

use deepspan_model::container::ContainerRef;
use deepspan_model::{
    softirq, BlockRq, Comm, Event, EventKind, Fields, Name, SchedSwitch, Socket, Tid, Value, Wakeup,
};

use crate::graph::{EdgeType, Graph, VertexId};
use crate::held::HeldBack;
use crate::syscalls::Arch;
use rustc_hash::FxHashMap;

use super::network::LocalPacket;
use super::waker::Waker;
use super::{
    softirq_name, BlockIo, BlockPhase, BlockReason, CgroupMove, CpuHistory, CpuInterval, Interrupt,
    InterruptInterval, KernelModel, LostRange, ModelStats, NetworkEnds, ReadChars, StateInterval,
    SyscallInterval, ThreadHistory, ThreadState, NO_CPU,
};

/// Largest CPU number accepted; events claiming a larger one are counted
/// and skipped instead of growing per-CPU tables without bound.
pub const MAX_CPUS: u32 = 8192;

/// A `sched_waking` seen while its target still runs elsewhere explains a
/// blocking switch-out of that target only if the switch-out follows within
/// this window (the waker raced the target's way into `schedule()`).
pub const PENDING_WAKING_WINDOW_NS: u64 = 50_000;

/// Deepest interrupt nesting kept per CPU; deeper means exits were lost.
const MAX_NESTING: usize = 32;

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
    pub(super) threads: Vec<ThreadRec>,
    pub(super) index: TidIndex,
    pub(super) cpus: Vec<CpuRec>,
    pub(super) graph: Graph,
    lost: Vec<LostRange>,
    pub(super) irq_names: FxHashMap<i32, Name>,
    pub(super) syscall_names: SyscallNames,
    waking_seen: bool,
    start: Option<u64>,
    last_ts: u64,
    pub(super) stats: ModelStats,
    /// False: no execution graph (see [`StateBuilder::without_graph`]).
    pub(super) graph_on: bool,
    /// False: interrupt handler runs are not kept (see
    /// [`StateBuilder::without_interrupt_history`]).
    interrupts_on: bool,
    /// False: the graph's rows end at their last event instead of at the
    /// end of the trace (see [`StateBuilder::open_ended`]).
    close_rows: bool,
    block_io: Vec<BlockIo>,
    cgroup_moves: Vec<CgroupMove>,
    pub(super) packets: NetworkEnds,
    /// See [`StateBuilder::recorder_threads`].
    pub(super) recorder_tids: Vec<Tid>,
    /// Names syscall numbers for traces without syscall names.
    pub(super) arch: Arch,
    /// Packets a thread queued on a device, by skb address: who queued it,
    /// when, and on which device. A packet of the loopback device, or of
    /// a virtual pair (veth: the peer receives the very skb the other end
    /// queued), is received with the same address.
    pub(super) local_in_flight: FxHashMap<u64, LocalPacket>,
    /// The host of each CPU, in a model of several hosts (empty: one).
    pub(super) cpu_hosts: Vec<u32>,
    /// Recorded TCP segments sent and not yet received, by key: the
    /// sending context's vertex at the send, and when (see
    /// [`StateBuilder::segment`]).
    pub(super) segments_in_flight: FxHashMap<u64, (VertexId, u64)>,
    /// True once the input has had a sleep in a system call (see
    /// [`StateBuilder::blocked_syscall`]): a thread's open call then ends
    /// when the thread runs again.
    switch_out_calls: bool,
    /// The names of recorded socket calls, `recv` and `send`, once
    /// interned (see [`StateBuilder::socket_call`]).
    socket_call_names: Option<[u16; 2]>,
}

pub(super) struct ThreadRec {
    pub(super) hist: ThreadHistory,
    open: Option<Open>,
    pub(super) open_syscall: Option<SyscallInterval>,
    exiting: bool,
    /// Forked and not yet `sched_wakeup_new`: that wake-up is expected.
    forked: bool,
    pending_waking: Option<u64>,
    worker: u32,
    /// A wait that a timer woke the thread from, which it may resume (see
    /// [`StateBuilder::resume_or_end_wait`]).
    resumable: Option<ResumableWait>,
}

/// A sleep in a system call that a timer ended: where its graph edge
/// began, and the call (number and first two arguments).
#[derive(Clone, Copy)]
struct ResumableWait {
    vertex: VertexId,
    call: (i32, u64, u64),
}

#[derive(Clone, Copy)]
struct Open {
    start: u64,
    state: ThreadState,
    cpu: u32,
}

impl Open {
    /// The interval this state makes once it ends at `end`.
    fn ended_at(self, end: u64) -> StateInterval {
        StateInterval {
            start: self.start,
            end,
            state: self.state,
            cpu: self.cpu,
        }
    }
}

#[derive(Default)]
pub(super) struct CpuRec {
    pub(super) current: Option<Tid>,
    since: u64,
    seen: bool,
    last_ts: u64,
    timeline: Vec<CpuInterval>,
    interrupts: Vec<InterruptInterval>,
    pub(super) stack: Vec<Frame>,
    /// A block request completed / a packet arrived in thread context since
    /// the last switch: that thread's wake-ups are I/O completions.
    pub(super) thread_block: bool,
    pub(super) thread_packet: bool,
    /// The key of the last message given to [`StateBuilder::packet`] as
    /// received in thread context since the last switch.
    pub(super) thread_message: Option<u64>,
    /// The last recorded TCP segment received in thread context since the
    /// last switch (see [`StateBuilder::segment`]): key and time.
    pub(super) thread_segment: Option<(u64, u64)>,
    /// The thread that queued a packet on the loopback device since the
    /// last switch (in thread context): a NET_RX softirq run in its
    /// context then delivers its packets.
    pub(super) loopback_sender: Option<Tid>,
}

#[derive(Clone, Copy)]
pub(super) struct Frame {
    pub(super) kind: Interrupt,
    pub(super) timer_ipi: bool,
    pub(super) start: u64,
    pub(super) block: bool,
    pub(super) packet: bool,
    /// A packet of the loopback device, or one a local thread sent over a
    /// virtual pair, was received in this frame.
    pub(super) loopback: bool,
    /// The thread that queued the last local packet received in this
    /// frame, matched by skb address: the frame's wake-ups deliver its
    /// data, whatever thread the softirq runs on (the sender's own,
    /// ksoftirqd's, or one whose events were filtered out).
    pub(super) loopback_from: Option<Tid>,
    /// The key of the last message received in this frame.
    pub(super) message: Option<u64>,
}

const NO_WORKER: u32 = u32::MAX;

/// Thread index lookup: a flat table for ordinary tids, a map for the rest.
#[derive(Default)]
pub(super) struct TidIndex {
    flat: Vec<u32>,
    other: FxHashMap<Tid, u32>,
}

const FLAT_TIDS: usize = 1 << 22;

impl TidIndex {
    #[inline]
    pub(super) fn get(&self, tid: Tid) -> Option<u32> {
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
pub(super) struct SyscallNames {
    pub(super) names: Vec<Name>,
    by_text: FxHashMap<Name, u16>,
    by_ptr: FxHashMap<usize, u16>,
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
            irq_names: FxHashMap::default(),
            syscall_names: SyscallNames::default(),
            waking_seen: false,
            start: None,
            last_ts: 0,
            stats: ModelStats::default(),
            graph_on: true,
            interrupts_on: true,
            close_rows: true,
            block_io: Vec::new(),
            cgroup_moves: Vec::new(),
            packets: NetworkEnds::default(),
            recorder_tids: Vec::new(),
            arch: Arch::default(),
            local_in_flight: FxHashMap::default(),
            cpu_hosts: Vec::new(),
            segments_in_flight: FxHashMap::default(),
            switch_out_calls: false,
            socket_call_names: None,
        }
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
    ///
    /// `read_chars`, when known, is the bytes the thread's read-like calls
    /// had returned by the sleep (the kernel's `rchar`): two of a thread's
    /// sleeps bracket what it read between them, cache hits included
    /// ([`ThreadHistory::read_chars_around`](crate::ThreadHistory::read_chars_around)).
    pub fn blocked_syscall(
        &mut self,
        ts: u64,
        tid: Tid,
        nr: i32,
        args: [u64; 3],
        read_chars: Option<u64>,
    ) {
        if tid <= 0 {
            return;
        }
        let ts = self.clock(ts);
        self.switch_out_calls = true;
        let t = self.thread(tid);
        let th = &mut self.threads[t];
        if let Some(bytes) = read_chars {
            th.hist.read_chars.push(ReadChars { ts, bytes });
        }
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
    /// no length named `recv` or `send` at `ts`, with its `socket` when
    /// the capture named it ([`SyscallInterval::socket_call`]). Like
    /// [`StateBuilder::blocked_syscall`], not for a trace with the
    /// system-call events.
    pub fn socket_call(
        &mut self,
        ts: u64,
        tid: Tid,
        sent: bool,
        bytes: u64,
        socket: Option<Socket>,
    ) {
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
        let name = if sent { send } else { recv };
        th.hist
            .syscalls
            .push(SyscallInterval::socket_call(ts, name, sent, bytes, socket));
    }

    /// The idle task gave `cpu` to thread `tid` at `ts` (the recorder's
    /// capture of switches out of idle, `kernel/idle_switches.tsv`; any
    /// preset). ftrace loses many of these switches on some machines,
    /// while a BPF program on the same tracepoint sees each one. A switch
    /// the trace has too is one switch: whichever comes first makes it and
    /// the other is skipped (here, when `tid` already runs on `cpu`; in
    /// the trace's `sched_switch`, when its next thread already does). One
    /// the trace lacks is made here, as the trace's would have been.
    pub fn idle_switch(&mut self, ts: u64, cpu: u32, tid: Tid) {
        if tid <= 0 || cpu >= MAX_CPUS || self.current(cpu) == Some(tid) {
            return;
        }
        let ts = self.clock(ts);
        self.stats.idle_switches_added += 1;
        let none = Comm::from_bytes(&[]);
        self.sched_switch(
            ts,
            cpu,
            &SchedSwitch {
                prev_tid: 0,
                prev_comm: none,
                prev_prio: 120,
                prev_state: 0,
                next_tid: tid,
                next_comm: none,
                next_prio: 120,
            },
        );
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
            EventKind::NetifReceiveSkb(p) => self.netif_receive_skb(ts, cpu, p),
            EventKind::NetDevQueue(p) => self.net_dev_queue(ts, cpu, p),
            EventKind::CgroupAttachTask {
                tid,
                dst_root,
                dst_path,
            } => self.cgroup_moves.push(CgroupMove {
                ts,
                tid: *tid,
                root: *dst_root,
                container: ContainerRef::from_cgroup_path(dst_path),
            }),
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
                th.hist.states.push(open.ended_at(end.max(open.start)));
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
        let mut index = FxHashMap::default();
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
            cgroup_moves: self.cgroup_moves,
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

    pub(super) fn clock(&mut self, ts: u64) -> u64 {
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

    pub(super) fn cpu_mut(&mut self, cpu: u32) -> &mut CpuRec {
        let i = cpu as usize;
        if self.cpus.len() <= i {
            self.cpus.resize_with(i + 1, CpuRec::default);
        }
        let c = &mut self.cpus[i];
        c.seen = true;
        c
    }

    pub(super) fn current(&self, cpu: u32) -> Option<Tid> {
        self.cpus.get(cpu as usize).and_then(|c| c.current)
    }

    /// Index of `tid`'s record, created on first sight.
    #[inline]
    pub(super) fn thread(&mut self, tid: Tid) -> usize {
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
            resumable: None,
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
        if state == ThreadState::Unknown {
            // What the thread did since is not known: no wait resumes.
            self.threads[t].resumable = None;
        }
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
                self.threads[t].hist.states.push(o.ended_at(ts));
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
    pub(super) fn worker(&mut self, t: usize) -> u32 {
        let th = &mut self.threads[t];
        if th.worker == NO_WORKER {
            th.worker = self.graph.worker(th.hist.tid);
        }
        th.worker
    }

    /// A vertex of thread `t` at `ts`, splitting its current graph edge
    /// (the state interval stays whole).
    pub(super) fn vertex_now(&mut self, t: usize, ts: u64) -> VertexId {
        // A vertex others link to or keep: the row up to here stays as it
        // is, so a wait before it is not resumed across it.
        self.threads[t].resumable = None;
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
                self.threads[t].hist.states.push(o.ended_at(ts));
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
        th.resumable = None;
    }

    fn sched_switch(&mut self, ts: u64, cpu: u32, s: &SchedSwitch) {
        if s.prev_tid == 0 && s.next_tid > 0 && self.current(cpu) == Some(s.next_tid) {
            // The recorder's capture of this switch out of idle came first
            // (see `idle_switch`): only the name is new.
            let t = self.thread(s.next_tid);
            self.set_name(t, ts, s.next_comm);
            return;
        }
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
        let Some(waker) = self.waker_of(ts, cpu, ev_tid, t) else {
            // The target ran its own wake-up: spurious, counted there.
            return;
        };
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
                self.resume_or_end_wait(t, reason);
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

    /// A wait that a timer interrupted but did not end is one wait, and
    /// what ends it is what it waited for. A thread woken by a timer from
    /// a sleep in a system call that, without touching another thread
    /// (no wake-up given, no packet sent: no vertex others link to), sleeps
    /// again in the same call (the same number and first two arguments)
    /// and is then woken by a thread, waited for that thread all along:
    /// its graph row is cut back to where the first sleep began, so that
    /// one BLOCKED edge spans both sleeps and the run between, and the
    /// critical path follows the waker over all of it. Without this a
    /// timeout the thread answers by waiting again (PostgreSQL's `SIGALRM`
    /// inside a lock wait, a poll loop's timeout) would end the path at a
    /// TIMER piece. Its thread states stay as they were. Called with the
    /// reason of each wake-up from a sleep, before the graph is extended.
    fn resume_or_end_wait(&mut self, t: usize, reason: BlockReason) {
        if !self.graph_on {
            return;
        }
        let call = self.threads[t]
            .open_syscall
            .filter(|s| s.id >= 0)
            .map(|s| (s.id, s.arg0, s.arg1));
        match reason {
            BlockReason::Timer => {
                let kept = self.threads[t].resumable.filter(|r| Some(r.call) == call);
                let resumable = kept.or_else(|| {
                    let call = call?;
                    let start = self.threads[t].open?.start;
                    let worker = self.worker(t);
                    let vertex = self.graph.tail(worker)?;
                    (self.graph.ts(vertex) == start).then_some(ResumableWait { vertex, call })
                });
                self.threads[t].resumable = resumable;
            }
            BlockReason::Thread(_) | BlockReason::PacketFrom(_) => {
                if let Some(r) = self.threads[t].resumable.take() {
                    if Some(r.call) == call && self.graph.truncate_after(r.vertex) {
                        self.stats.resumed_waits += 1;
                    }
                }
            }
            _ => self.threads[t].resumable = None,
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
        self.stats.syscall_exits += 1;
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
}
