//! The typed fast path: for each event id, worked out once when the schema
//! is loaded, which [`EventKind`] variant it decodes to and where its fields
//! are. Field positions come from the format file by name, never from fixed
//! offsets, because layouts differ between kernels (e.g. `prev_state` is
//! `long` on new kernels and `int` on old ones; comms moved to `__data_loc`).

use std::sync::Arc;

use deepspan_model::{BlockRq, Comm, EventKind, Name, Packet, SchedSwitch, Wakeup};

use crate::format::{ArrayLen, Dynamic, EventFormat, FieldFormat};
use crate::schema::Schema;
use crate::source::Endian;

/// An integer field in place; `size == 0` means absent (reads as 0).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IntAt {
    off: u32,
    size: u8,
    signed: bool,
}

impl IntAt {
    pub(crate) const fn new(off: u32, size: u8, signed: bool) -> IntAt {
        IntAt { off, size, signed }
    }

    fn of(f: &FieldFormat) -> Option<IntAt> {
        let scalar = f.array.is_none() && f.dynamic.is_none();
        (scalar && matches!(f.size, 1 | 2 | 4 | 8)).then_some(IntAt {
            off: f.offset as u32,
            size: f.size as u8,
            signed: f.signed,
        })
    }

    /// The unsigned value; `None` when absent or out of bounds.
    #[inline]
    pub(crate) fn u64_checked(self, p: &[u8], e: Endian) -> Option<u64> {
        e.uint(p, self.off as usize, self.size as usize)
    }

    /// The value, sign-extended when the field is signed; 0 when the record
    /// is too short (the typed path never fails).
    #[inline]
    pub(crate) fn i64(self, p: &[u8], e: Endian) -> i64 {
        let (off, size) = (self.off as usize, self.size as usize);
        if self.signed {
            e.int(p, off, size).unwrap_or(0)
        } else {
            e.uint(p, off, size).unwrap_or(0) as i64
        }
    }

    #[inline]
    fn u64(self, p: &[u8], e: Endian) -> u64 {
        self.i64(p, e) as u64
    }

    #[inline]
    fn i32(self, p: &[u8], e: Endian) -> i32 {
        self.i64(p, e) as i32
    }
}

/// A text field: a char array in place, or a `__data_loc`/`__rel_loc` one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TextAt {
    Absent,
    Fixed { off: u32, len: u32 },
    Dynamic { off: u32, kind: Dynamic },
}

impl TextAt {
    fn of(f: &FieldFormat) -> Option<TextAt> {
        if let Some(kind) = f.dynamic {
            return (f.size == 4).then_some(TextAt::Dynamic {
                off: f.offset as u32,
                kind,
            });
        }
        match f.array {
            Some(ArrayLen::Fixed(_)) if f.elem_size == 1 => Some(TextAt::Fixed {
                off: f.offset as u32,
                len: f.size as u32,
            }),
            _ => None,
        }
    }

    /// The text bytes up to the first NUL; empty when absent or out of bounds.
    #[inline]
    fn bytes(self, p: &[u8], e: Endian) -> &[u8] {
        let raw = match self {
            TextAt::Absent => return &[],
            TextAt::Fixed { off, len } => {
                let off = off as usize;
                let end = (off + len as usize).min(p.len());
                p.get(off..end).unwrap_or(&[])
            }
            TextAt::Dynamic { off, kind } => match dynamic_range(p, off as usize, kind, e) {
                Some(r) => &p[r],
                None => &[],
            },
        };
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        &raw[..len]
    }

    #[inline]
    fn comm(self, p: &[u8], e: Endian) -> Comm {
        Comm::from_bytes(self.bytes(p, e))
    }
}

/// The byte range a `__data_loc`/`__rel_loc` word at `off` points to, if it
/// lies inside the record.
#[inline]
pub(crate) fn dynamic_range(
    p: &[u8],
    off: usize,
    kind: Dynamic,
    e: Endian,
) -> Option<std::ops::Range<usize>> {
    let word = e.uint(p, off, 4)? as u32;
    let mut start = (word & 0xffff) as usize;
    let len = (word >> 16) as usize;
    if kind == Dynamic::RelLoc {
        start += off + 4;
    }
    let end = start + len;
    (end <= p.len()).then_some(start..end)
}

/// The first `N` elements of an integer array in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ArrayAt {
    off: u32,
    elem: u8,
    len: u8,
}

impl ArrayAt {
    fn of(f: &FieldFormat) -> Option<ArrayAt> {
        match f.array {
            Some(ArrayLen::Fixed(n)) if matches!(f.elem_size, 1 | 2 | 4 | 8) => Some(ArrayAt {
                off: f.offset as u32,
                elem: f.elem_size as u8,
                len: n.min(255) as u8,
            }),
            _ => None,
        }
    }

    #[inline]
    fn read<const N: usize>(self, p: &[u8], e: Endian) -> [u64; N] {
        let mut out = [0u64; N];
        let size = self.elem as usize;
        for (i, slot) in out.iter_mut().enumerate().take(self.len as usize) {
            *slot = e.uint(p, self.off as usize + i * size, size).unwrap_or(0);
        }
        out
    }
}

/// Where `ipi:ipi_entry`'s reason is: a pointer to a constant string (the
/// usual case, resolved through the saved printk strings) or text.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReasonAt {
    Pointer(IntAt),
    Text(TextAt),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WakeKind {
    Waking,
    Wakeup,
    New,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Three {
    First,
    Second,
    Third,
}

/// The typed decoding of one event id.
#[derive(Clone, Debug)]
pub(crate) enum Typed {
    Other,
    SchedSwitch {
        prev_comm: TextAt,
        prev_pid: IntAt,
        prev_prio: IntAt,
        prev_state: IntAt,
        next_comm: TextAt,
        next_pid: IntAt,
        next_prio: IntAt,
    },
    Wakeup {
        kind: WakeKind,
        comm: TextAt,
        pid: IntAt,
        prio: IntAt,
        target_cpu: IntAt,
    },
    Fork {
        parent_comm: TextAt,
        parent_pid: IntAt,
        child_comm: TextAt,
        child_pid: IntAt,
    },
    Exec {
        filename: TextAt,
        pid: IntAt,
        old_pid: IntAt,
    },
    CgroupAttach {
        pid: IntAt,
        dst_root: IntAt,
        dst_path: TextAt,
    },
    ExitOrFree {
        free: bool,
        comm: TextAt,
        pid: IntAt,
        prio: IntAt,
    },
    Migrate {
        comm: TextAt,
        pid: IntAt,
        prio: IntAt,
        orig_cpu: IntAt,
        dest_cpu: IntAt,
    },
    IrqEntry {
        irq: IntAt,
        name: TextAt,
    },
    IrqExit {
        irq: IntAt,
        ret: IntAt,
    },
    Softirq {
        which: Three,
        vec: IntAt,
    },
    HrtimerEntry {
        hrtimer: IntAt,
        function: IntAt,
        now: IntAt,
    },
    HrtimerExit {
        hrtimer: IntAt,
    },
    /// x86 `irq_vectors:<kind>_entry/_exit`.
    Vector {
        entry: bool,
        kind: Name,
        vector: IntAt,
    },
    /// `ipi:ipi_entry/_exit`.
    Ipi {
        entry: bool,
        reason: ReasonAt,
    },
    SysEnter {
        id: IntAt,
        args: ArrayAt,
    },
    SysExit {
        id: IntAt,
        ret: IntAt,
    },
    Block {
        which: Three,
        dev: IntAt,
        sector: IntAt,
        nr_sector: IntAt,
        rwbs: TextAt,
        error: IntAt,
    },
    Net {
        receive: bool,
        skbaddr: IntAt,
        len: IntAt,
        name: TextAt,
    },
}

/// Field lookups for building a [`Typed`]; `None` from a required lookup
/// means the event keeps the generic form.
struct Lookup<'a>(&'a EventFormat);

impl Lookup<'_> {
    fn int(&self, name: &str) -> Option<IntAt> {
        self.0.field(name).and_then(IntAt::of)
    }
    fn opt_int(&self, name: &str) -> IntAt {
        self.int(name).unwrap_or_default()
    }
    fn text(&self, name: &str) -> TextAt {
        self.0
            .field(name)
            .and_then(TextAt::of)
            .unwrap_or(TextAt::Absent)
    }
}

impl Typed {
    /// Works out the typed decoding of an event format.
    pub(crate) fn build(f: &EventFormat) -> Typed {
        Typed::try_build(f).unwrap_or(Typed::Other)
    }

    fn try_build(f: &EventFormat) -> Option<Typed> {
        let l = Lookup(f);
        let wakeup = |kind| {
            Some(Typed::Wakeup {
                kind,
                comm: l.text("comm"),
                pid: l.int("pid")?,
                prio: l.opt_int("prio"),
                target_cpu: l.opt_int("target_cpu"),
            })
        };
        let softirq = |which| {
            Some(Typed::Softirq {
                which,
                vec: l.int("vec")?,
            })
        };
        let block = |which| {
            Some(Typed::Block {
                which,
                dev: l.int("dev")?,
                sector: l.int("sector")?,
                nr_sector: l.opt_int("nr_sector"),
                rwbs: l.text("rwbs"),
                error: l.opt_int("error"),
            })
        };
        let net = |receive| {
            Some(Typed::Net {
                receive,
                skbaddr: l.int("skbaddr")?,
                len: l.opt_int("len"),
                name: l.text("name"),
            })
        };
        let exit_or_free = |free| {
            Some(Typed::ExitOrFree {
                free,
                comm: l.text("comm"),
                pid: l.int("pid")?,
                prio: l.opt_int("prio"),
            })
        };
        match (f.system.as_str(), f.name.as_str()) {
            ("sched", "sched_switch") => Some(Typed::SchedSwitch {
                prev_comm: l.text("prev_comm"),
                prev_pid: l.int("prev_pid")?,
                prev_prio: l.opt_int("prev_prio"),
                prev_state: l.opt_int("prev_state"),
                next_comm: l.text("next_comm"),
                next_pid: l.int("next_pid")?,
                next_prio: l.opt_int("next_prio"),
            }),
            ("sched", "sched_waking") => wakeup(WakeKind::Waking),
            ("sched", "sched_wakeup") => wakeup(WakeKind::Wakeup),
            ("sched", "sched_wakeup_new") => wakeup(WakeKind::New),
            ("sched", "sched_process_fork") => Some(Typed::Fork {
                parent_comm: l.text("parent_comm"),
                parent_pid: l.int("parent_pid")?,
                child_comm: l.text("child_comm"),
                child_pid: l.int("child_pid")?,
            }),
            ("sched", "sched_process_exec") => Some(Typed::Exec {
                filename: l.text("filename"),
                pid: l.int("pid")?,
                old_pid: l.opt_int("old_pid"),
            }),
            ("cgroup", "cgroup_attach_task") => Some(Typed::CgroupAttach {
                pid: l.int("pid")?,
                dst_root: l.opt_int("dst_root"),
                dst_path: l.text("dst_path"),
            }),
            ("sched", "sched_process_exit") => exit_or_free(false),
            ("sched", "sched_process_free") => exit_or_free(true),
            ("sched", "sched_migrate_task") => Some(Typed::Migrate {
                comm: l.text("comm"),
                pid: l.int("pid")?,
                prio: l.opt_int("prio"),
                orig_cpu: l.opt_int("orig_cpu"),
                dest_cpu: l.opt_int("dest_cpu"),
            }),
            ("irq", "irq_handler_entry") => Some(Typed::IrqEntry {
                irq: l.int("irq")?,
                name: l.text("name"),
            }),
            ("irq", "irq_handler_exit") => Some(Typed::IrqExit {
                irq: l.int("irq")?,
                ret: l.opt_int("ret"),
            }),
            ("irq", "softirq_raise") => softirq(Three::First),
            ("irq", "softirq_entry") => softirq(Three::Second),
            ("irq", "softirq_exit") => softirq(Three::Third),
            ("timer", "hrtimer_expire_entry") => Some(Typed::HrtimerEntry {
                hrtimer: l.int("hrtimer")?,
                function: l.opt_int("function"),
                now: l.opt_int("now"),
            }),
            ("timer", "hrtimer_expire_exit") => Some(Typed::HrtimerExit {
                hrtimer: l.int("hrtimer")?,
            }),
            ("irq_vectors", name) => {
                let (kind, entry) = if let Some(kind) = name.strip_suffix("_entry") {
                    (kind, true)
                } else {
                    (name.strip_suffix("_exit")?, false)
                };
                Some(Typed::Vector {
                    entry,
                    kind: Name::new(kind),
                    vector: l.opt_int("vector"),
                })
            }
            ("ipi", "ipi_entry" | "ipi_exit") => {
                let entry = f.name == "ipi_entry";
                let field = f.field("reason")?;
                let reason = match (IntAt::of(field), TextAt::of(field)) {
                    (_, Some(text)) => ReasonAt::Text(text),
                    (Some(ptr), None) if field.type_name.contains('*') => ReasonAt::Pointer(ptr),
                    _ => return None,
                };
                Some(Typed::Ipi { entry, reason })
            }
            ("raw_syscalls", "sys_enter") => Some(Typed::SysEnter {
                id: l.int("id")?,
                args: f.field("args").and_then(ArrayAt::of).unwrap_or(ArrayAt {
                    off: 0,
                    elem: 8,
                    len: 0,
                }),
            }),
            ("raw_syscalls", "sys_exit") => Some(Typed::SysExit {
                id: l.int("id")?,
                ret: l.opt_int("ret"),
            }),
            ("block", "block_rq_insert") => block(Three::First),
            ("block", "block_rq_issue") => block(Three::Second),
            ("block", "block_rq_complete") => block(Three::Third),
            ("net", "net_dev_queue") => net(false),
            ("net", "netif_receive_skb") => net(true),
            _ => None,
        }
    }

    /// The name of the [`EventKind`] variant this decodes to; `None` for
    /// events that stay [`EventKind::Other`].
    pub(crate) fn variant(&self) -> Option<&'static str> {
        Some(match self {
            Typed::Other => return None,
            Typed::SchedSwitch { .. } => "SchedSwitch",
            Typed::Wakeup {
                kind: WakeKind::Waking,
                ..
            } => "SchedWaking",
            Typed::Wakeup {
                kind: WakeKind::Wakeup,
                ..
            } => "SchedWakeup",
            Typed::Wakeup {
                kind: WakeKind::New,
                ..
            } => "SchedWakeupNew",
            Typed::Fork { .. } => "SchedProcessFork",
            Typed::Exec { .. } => "SchedProcessExec",
            Typed::CgroupAttach { .. } => "CgroupAttachTask",
            Typed::ExitOrFree { free: false, .. } => "SchedProcessExit",
            Typed::ExitOrFree { free: true, .. } => "SchedProcessFree",
            Typed::Migrate { .. } => "SchedMigrateTask",
            Typed::IrqEntry { .. } => "IrqHandlerEntry",
            Typed::IrqExit { .. } => "IrqHandlerExit",
            Typed::Softirq {
                which: Three::First,
                ..
            } => "SoftirqRaise",
            Typed::Softirq {
                which: Three::Second,
                ..
            } => "SoftirqEntry",
            Typed::Softirq {
                which: Three::Third,
                ..
            } => "SoftirqExit",
            Typed::HrtimerEntry { .. } => "HrtimerExpireEntry",
            Typed::HrtimerExit { .. } => "HrtimerExpireExit",
            Typed::Vector { entry: true, .. } | Typed::Ipi { entry: true, .. } => "IpiEntry",
            Typed::Vector { entry: false, .. } | Typed::Ipi { entry: false, .. } => "IpiExit",
            Typed::SysEnter { .. } => "SysEnter",
            Typed::SysExit { .. } => "SysExit",
            Typed::Block {
                which: Three::First,
                ..
            } => "BlockRqInsert",
            Typed::Block {
                which: Three::Second,
                ..
            } => "BlockRqIssue",
            Typed::Block {
                which: Three::Third,
                ..
            } => "BlockRqComplete",
            Typed::Net { receive: false, .. } => "NetDevQueue",
            Typed::Net { receive: true, .. } => "NetifReceiveSkb",
        })
    }

    /// Decodes a record payload; `None` for [`Typed::Other`].
    #[inline]
    pub(crate) fn decode(&self, p: &[u8], schema: &Schema) -> Option<EventKind> {
        let e = schema.endian();
        Some(match self {
            Typed::Other => return None,
            Typed::SchedSwitch {
                prev_comm,
                prev_pid,
                prev_prio,
                prev_state,
                next_comm,
                next_pid,
                next_prio,
            } => EventKind::SchedSwitch(SchedSwitch {
                prev_tid: prev_pid.i32(p, e),
                prev_comm: prev_comm.comm(p, e),
                prev_prio: prev_prio.i32(p, e),
                prev_state: prev_state.i64(p, e),
                next_tid: next_pid.i32(p, e),
                next_comm: next_comm.comm(p, e),
                next_prio: next_prio.i32(p, e),
            }),
            Typed::Wakeup {
                kind,
                comm,
                pid,
                prio,
                target_cpu,
            } => {
                let w = Wakeup {
                    tid: pid.i32(p, e),
                    comm: comm.comm(p, e),
                    prio: prio.i32(p, e),
                    target_cpu: target_cpu.i32(p, e),
                };
                match kind {
                    WakeKind::Waking => EventKind::SchedWaking(w),
                    WakeKind::Wakeup => EventKind::SchedWakeup(w),
                    WakeKind::New => EventKind::SchedWakeupNew(w),
                }
            }
            Typed::Fork {
                parent_comm,
                parent_pid,
                child_comm,
                child_pid,
            } => EventKind::SchedProcessFork {
                parent_tid: parent_pid.i32(p, e),
                parent_comm: parent_comm.comm(p, e),
                child_tid: child_pid.i32(p, e),
                child_comm: child_comm.comm(p, e),
            },
            Typed::Exec {
                filename,
                pid,
                old_pid,
            } => EventKind::SchedProcessExec {
                tid: pid.i32(p, e),
                old_tid: old_pid.i32(p, e),
                filename: Arc::from(String::from_utf8_lossy(filename.bytes(p, e)).as_ref()),
            },
            Typed::CgroupAttach {
                pid,
                dst_root,
                dst_path,
            } => EventKind::CgroupAttachTask {
                tid: pid.i32(p, e),
                dst_root: dst_root.i32(p, e),
                dst_path: Arc::from(String::from_utf8_lossy(dst_path.bytes(p, e)).as_ref()),
            },
            Typed::ExitOrFree {
                free,
                comm,
                pid,
                prio,
            } => {
                let (tid, comm, prio) = (pid.i32(p, e), comm.comm(p, e), prio.i32(p, e));
                if *free {
                    EventKind::SchedProcessFree { tid, comm, prio }
                } else {
                    EventKind::SchedProcessExit { tid, comm, prio }
                }
            }
            Typed::Migrate {
                comm,
                pid,
                prio,
                orig_cpu,
                dest_cpu,
            } => EventKind::SchedMigrateTask {
                tid: pid.i32(p, e),
                comm: comm.comm(p, e),
                prio: prio.i32(p, e),
                orig_cpu: orig_cpu.i32(p, e),
                dest_cpu: dest_cpu.i32(p, e),
            },
            Typed::IrqEntry { irq, name } => EventKind::IrqHandlerEntry {
                irq: irq.i32(p, e),
                name: Name::from_utf8_cached(name.bytes(p, e)),
            },
            Typed::IrqExit { irq, ret } => EventKind::IrqHandlerExit {
                irq: irq.i32(p, e),
                ret: ret.i32(p, e),
            },
            Typed::Softirq { which, vec } => {
                let vec = vec.u64(p, e) as u32;
                match which {
                    Three::First => EventKind::SoftirqRaise { vec },
                    Three::Second => EventKind::SoftirqEntry { vec },
                    Three::Third => EventKind::SoftirqExit { vec },
                }
            }
            Typed::HrtimerEntry {
                hrtimer,
                function,
                now,
            } => EventKind::HrtimerExpireEntry {
                hrtimer: hrtimer.u64(p, e),
                function: function.u64(p, e),
                now: now.i64(p, e),
            },
            Typed::HrtimerExit { hrtimer } => EventKind::HrtimerExpireExit {
                hrtimer: hrtimer.u64(p, e),
            },
            Typed::Vector {
                entry,
                kind,
                vector,
            } => {
                let (kind, vector) = (kind.clone(), vector.i32(p, e));
                if *entry {
                    EventKind::IpiEntry { kind, vector }
                } else {
                    EventKind::IpiExit { kind, vector }
                }
            }
            Typed::Ipi { entry, reason } => {
                let kind = match reason {
                    ReasonAt::Pointer(ptr) => schema.printk_string(ptr.u64(p, e)),
                    ReasonAt::Text(text) => Name::from_utf8_cached(text.bytes(p, e)),
                };
                if *entry {
                    EventKind::IpiEntry { kind, vector: -1 }
                } else {
                    EventKind::IpiExit { kind, vector: -1 }
                }
            }
            Typed::SysEnter { id, args } => EventKind::SysEnter {
                id: id.i64(p, e),
                name: None,
                args: args.read::<6>(p, e),
            },
            Typed::SysExit { id, ret } => EventKind::SysExit {
                id: id.i64(p, e),
                name: None,
                ret: ret.i64(p, e),
            },
            Typed::Block {
                which,
                dev,
                sector,
                nr_sector,
                rwbs,
                error,
            } => {
                let mut flags = [0u8; 8];
                let text = rwbs.bytes(p, e);
                let n = text.len().min(8);
                flags[..n].copy_from_slice(&text[..n]);
                let rq = BlockRq {
                    dev: dev.u64(p, e) as u32,
                    sector: sector.u64(p, e),
                    nr_sector: nr_sector.u64(p, e) as u32,
                    rwbs: flags,
                    error: error.i32(p, e),
                };
                match which {
                    Three::First => EventKind::BlockRqInsert(rq),
                    Three::Second => EventKind::BlockRqIssue(rq),
                    Three::Third => EventKind::BlockRqComplete(rq),
                }
            }
            Typed::Net {
                receive,
                skbaddr,
                len,
                name,
            } => {
                let packet = Packet {
                    skbaddr: skbaddr.u64(p, e),
                    len: len.u64(p, e) as u32,
                    dev: Name::from_utf8_cached(name.bytes(p, e)),
                };
                if *receive {
                    EventKind::NetifReceiveSkb(packet)
                } else {
                    EventKind::NetDevQueue(packet)
                }
            }
        })
    }
}
