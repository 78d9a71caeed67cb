//! Typed kernel events: the vocabulary every analysis speaks.
//!
//! Readers (trace.dat, CTF) decode their own formats into [`Event`]. The
//! variants cover what the state model and critical-path analyses consume;
//! everything else is [`EventKind::Other`], whose fields stay reachable
//! through the reader's generic field access.

use std::fmt;
use std::sync::Arc;

use crate::Name;

/// A thread id as the kernel sees it (`pid` in kernel speak).
pub type Tid = i32;

/// A 16-byte task name as carried by sched events (`TASK_COMM_LEN`).
///
/// Kept inline so typed events never allocate.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Comm([u8; 16]);

impl Comm {
    /// Builds a comm from raw bytes, truncating at the first NUL or at 16 bytes.
    #[inline]
    pub fn from_bytes(raw: &[u8]) -> Comm {
        if let Some(head) = raw.first_chunk::<16>() {
            // Every sched event carries one or two names: find the NUL a
            // word at a time (the lowest flagged byte is exact).
            const LO: u128 = u128::from_ne_bytes([1; 16]);
            const HI: u128 = u128::from_ne_bytes([0x80; 16]);
            let v = u128::from_le_bytes(*head);
            let zeros = v.wrapping_sub(LO) & !v & HI;
            let keep = match zeros.trailing_zeros() {
                128 => u128::MAX,
                bit => (1u128 << (bit & !7)) - 1,
            };
            return Comm((v & keep).to_le_bytes());
        }
        let mut out = [0u8; 16];
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        out[..len].copy_from_slice(&raw[..len]);
        Comm(out)
    }

    pub fn as_bytes(&self) -> &[u8] {
        let len = self.0.iter().position(|&b| b == 0).unwrap_or(16);
        &self.0[..len]
    }

    /// The name as text; invalid UTF-8 is replaced, as task names are arbitrary bytes.
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

/// One kernel event on the common (host monotonic) time base.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Nanoseconds of CLOCK_MONOTONIC of the recording host.
    pub ts: u64,
    pub cpu: u32,
    /// The thread that was current on `cpu` when the event fired
    /// (0 is the idle task; in interrupt context it is the interrupted thread).
    pub tid: Tid,
    pub kind: EventKind,
}

impl Event {
    /// Rewrites every thread id the event holds (the current thread and
    /// those in its payload) through `f`. For several hosts in one model,
    /// whose thread ids would otherwise collide.
    pub fn map_tids(&mut self, mut f: impl FnMut(Tid) -> Tid) {
        self.tid = f(self.tid);
        match &mut self.kind {
            EventKind::SchedSwitch(s) => {
                s.prev_tid = f(s.prev_tid);
                s.next_tid = f(s.next_tid);
            }
            EventKind::SchedWaking(w)
            | EventKind::SchedWakeup(w)
            | EventKind::SchedWakeupNew(w) => w.tid = f(w.tid),
            EventKind::SchedProcessFork {
                parent_tid,
                child_tid,
                ..
            } => {
                *parent_tid = f(*parent_tid);
                *child_tid = f(*child_tid);
            }
            EventKind::SchedProcessExec { tid, old_tid, .. } => {
                *tid = f(*tid);
                *old_tid = f(*old_tid);
            }
            EventKind::SchedProcessExit { tid, .. }
            | EventKind::SchedProcessFree { tid, .. }
            | EventKind::SchedMigrateTask { tid, .. }
            | EventKind::CgroupAttachTask { tid, .. } => *tid = f(*tid),
            EventKind::IrqHandlerEntry { .. }
            | EventKind::IrqHandlerExit { .. }
            | EventKind::SoftirqRaise { .. }
            | EventKind::SoftirqEntry { .. }
            | EventKind::SoftirqExit { .. }
            | EventKind::HrtimerExpireEntry { .. }
            | EventKind::HrtimerExpireExit { .. }
            | EventKind::IpiEntry { .. }
            | EventKind::IpiExit { .. }
            | EventKind::SysEnter { .. }
            | EventKind::SysExit { .. }
            | EventKind::BlockRqInsert(_)
            | EventKind::BlockRqIssue(_)
            | EventKind::BlockRqComplete(_)
            | EventKind::NetDevQueue(_)
            | EventKind::NetifReceiveSkb(_)
            | EventKind::Other { .. } => {}
        }
    }
}

/// `sched_switch` payload; see [`SchedSwitch::prev_runnable`] for how
/// preemption is told apart from blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedSwitch {
    pub prev_tid: Tid,
    pub prev_comm: Comm,
    pub prev_prio: i32,
    pub prev_state: i64,
    pub next_tid: Tid,
    pub next_comm: Comm,
    pub next_prio: i32,
}

impl SchedSwitch {
    /// True when the task switched out was still runnable, i.e. preempted
    /// rather than blocked.
    ///
    /// The low byte holds the reported sleep states (S, D, T, t, X, Z, P, I);
    /// higher bits (TASK_REPORT_MAX, shown as `R+`, and the preempt bits of
    /// older kernels) only ever accompany a runnable task. Testing just the
    /// S|D bits would call parked and idle kernel threads runnable.
    pub fn prev_runnable(&self) -> bool {
        self.prev_state & 0xff == 0
    }
}

/// Payload shared by `sched_waking`, `sched_wakeup` and `sched_wakeup_new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wakeup {
    pub tid: Tid,
    pub comm: Comm,
    pub prio: i32,
    pub target_cpu: i32,
}

/// Block-layer request identity and size, shared by insert/issue/complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRq {
    /// Kernel `dev_t` (major << 20 | minor).
    pub dev: u32,
    pub sector: u64,
    pub nr_sector: u32,
    /// `rwbs` flags as text, e.g. `R`, `WS`, `RA`.
    pub rwbs: [u8; 8],
    /// Only set on completion: 0 or a negative errno.
    pub error: i32,
}

impl BlockRq {
    pub fn rwbs_str(&self) -> &str {
        let len = self
            .rwbs
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.rwbs.len());
        std::str::from_utf8(&self.rwbs[..len]).unwrap_or("?")
    }
}

/// Packet metadata shared by `net_dev_queue` and `netif_receive_skb`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub skbaddr: u64,
    pub len: u32,
    /// Device name (`eth0`, `lo`, …).
    pub dev: Name,
}

/// What happened. Variant names follow the kernel event names.
#[derive(Clone, Debug, PartialEq)]
pub enum EventKind {
    SchedSwitch(SchedSwitch),
    SchedWaking(Wakeup),
    SchedWakeup(Wakeup),
    SchedWakeupNew(Wakeup),
    SchedProcessFork {
        parent_tid: Tid,
        parent_comm: Comm,
        child_tid: Tid,
        child_comm: Comm,
    },
    SchedProcessExec {
        tid: Tid,
        old_tid: Tid,
        filename: Arc<str>,
    },
    SchedProcessExit {
        tid: Tid,
        comm: Comm,
        prio: i32,
    },
    SchedProcessFree {
        tid: Tid,
        comm: Comm,
        prio: i32,
    },
    SchedMigrateTask {
        tid: Tid,
        comm: Comm,
        prio: i32,
        orig_cpu: i32,
        dest_cpu: i32,
    },
    IrqHandlerEntry {
        irq: i32,
        name: Name,
    },
    IrqHandlerExit {
        irq: i32,
        ret: i32,
    },
    SoftirqRaise {
        vec: u32,
    },
    SoftirqEntry {
        vec: u32,
    },
    SoftirqExit {
        vec: u32,
    },
    HrtimerExpireEntry {
        hrtimer: u64,
        function: u64,
        now: i64,
    },
    HrtimerExpireExit {
        hrtimer: u64,
    },
    /// An inter-processor interrupt handler starts (x86 `irq_vectors:*_entry`,
    /// arm `ipi:ipi_entry`). `kind` names it, e.g. `reschedule`.
    IpiEntry {
        kind: Name,
        vector: i32,
    },
    IpiExit {
        kind: Name,
        vector: i32,
    },
    /// `raw_syscalls:sys_enter`, or a named syscall entry (LTTng) with its
    /// positional arguments; `id` is -1 when only the name is known.
    SysEnter {
        id: i64,
        name: Option<Name>,
        args: [u64; 6],
    },
    SysExit {
        id: i64,
        name: Option<Name>,
        ret: i64,
    },
    BlockRqInsert(BlockRq),
    BlockRqIssue(BlockRq),
    BlockRqComplete(BlockRq),
    NetDevQueue(Packet),
    NetifReceiveSkb(Packet),
    /// A task moved into the cgroup `dst_path` of one hierarchy (a
    /// container runtime placing a container's first process, a write to
    /// `cgroup.procs`): what names a process's container from then on.
    CgroupAttachTask {
        tid: Tid,
        /// The hierarchy (cgroup v1 has one per controller set; v2 one).
        dst_root: i32,
        dst_path: Arc<str>,
    },
    /// Any event without a typed variant; `name` is the bare event name.
    Other {
        name: Name,
    },
}

/// Softirq vector numbers (`include/linux/interrupt.h`).
pub mod softirq {
    pub const HI: u32 = 0;
    pub const TIMER: u32 = 1;
    pub const NET_TX: u32 = 2;
    pub const NET_RX: u32 = 3;
    pub const BLOCK: u32 = 4;
    pub const IRQ_POLL: u32 = 5;
    pub const TASKLET: u32 = 6;
    pub const SCHED: u32 = 7;
    pub const HRTIMER: u32 = 8;
    pub const RCU: u32 = 9;
}

impl EventKind {
    /// The event name as ftrace spells it (without the subsystem).
    pub fn name(&self) -> &str {
        match self {
            EventKind::SchedSwitch(_) => "sched_switch",
            EventKind::SchedWaking(_) => "sched_waking",
            EventKind::SchedWakeup(_) => "sched_wakeup",
            EventKind::SchedWakeupNew(_) => "sched_wakeup_new",
            EventKind::SchedProcessFork { .. } => "sched_process_fork",
            EventKind::SchedProcessExec { .. } => "sched_process_exec",
            EventKind::SchedProcessExit { .. } => "sched_process_exit",
            EventKind::SchedProcessFree { .. } => "sched_process_free",
            EventKind::SchedMigrateTask { .. } => "sched_migrate_task",
            EventKind::IrqHandlerEntry { .. } => "irq_handler_entry",
            EventKind::IrqHandlerExit { .. } => "irq_handler_exit",
            EventKind::SoftirqRaise { .. } => "softirq_raise",
            EventKind::SoftirqEntry { .. } => "softirq_entry",
            EventKind::SoftirqExit { .. } => "softirq_exit",
            EventKind::HrtimerExpireEntry { .. } => "hrtimer_expire_entry",
            EventKind::HrtimerExpireExit { .. } => "hrtimer_expire_exit",
            EventKind::IpiEntry { .. } => "ipi_entry",
            EventKind::IpiExit { .. } => "ipi_exit",
            EventKind::SysEnter { .. } => "sys_enter",
            EventKind::SysExit { .. } => "sys_exit",
            EventKind::BlockRqInsert(_) => "block_rq_insert",
            EventKind::BlockRqIssue(_) => "block_rq_issue",
            EventKind::BlockRqComplete(_) => "block_rq_complete",
            EventKind::NetDevQueue(_) => "net_dev_queue",
            EventKind::NetifReceiveSkb(_) => "netif_receive_skb",
            EventKind::CgroupAttachTask { .. } => "cgroup_attach_task",
            EventKind::Other { name } => name,
        }
    }
}

/// A generic field value, for events (or fields) without a typed form.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
}

/// Named field values of one event, in declaration order.
pub type Fields = Vec<(Arc<str>, Value)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_truncates_at_nul_and_sixteen_bytes() {
        assert_eq!(Comm::from_bytes(b"bash\0garbage").to_string_lossy(), "bash");
        assert_eq!(
            Comm::from_bytes(b"0123456789abcdefXYZ").as_bytes(),
            b"0123456789abcdef"
        );
        assert_eq!(
            Comm::from_bytes(b"bash\0garbage\0\x01\x80\xff\0").as_bytes(),
            b"bash"
        );
        assert_eq!(
            Comm::from_bytes(b"0123456789abcdef").as_bytes(),
            b"0123456789abcdef"
        );
        assert_eq!(Comm::from_bytes(b"\x00123456789abcdef").as_bytes(), b"");
        assert_eq!(Comm::from_bytes(b"short").as_bytes(), b"short");
        // Every position of the NUL, next to bytes that borrow.
        for at in 0..16 {
            let mut raw = [0x81u8; 16];
            raw[at] = 0;
            if at + 1 < 16 {
                raw[at + 1] = 1;
            }
            assert_eq!(Comm::from_bytes(&raw).as_bytes(), &raw[..at]);
        }
    }

    #[test]
    fn preempted_when_prev_state_is_runnable() {
        let mut s = SchedSwitch {
            prev_tid: 1,
            prev_comm: Comm::default(),
            prev_prio: 120,
            prev_state: 0,
            next_tid: 2,
            next_comm: Comm::default(),
            next_prio: 120,
        };
        assert!(s.prev_runnable());
        s.prev_state = 0x100; // TASK_REPORT_MAX-style "R+": still runnable
        assert!(s.prev_runnable());
        s.prev_state = 1;
        assert!(!s.prev_runnable());
        s.prev_state = 2;
        assert!(!s.prev_runnable());
        s.prev_state = 0x80; // I: an idle kernel thread sleeps
        assert!(!s.prev_runnable());
    }
}
