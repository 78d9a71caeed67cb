//! LTTng kernel events mapped to the typed model ([`deepspan_model::EventKind`]).
//!
//! The mapping reads a handful of payload fields per event. Where the
//! layout says where a field is ([`Direct`]: after fields of fixed size),
//! it is read straight from the packet through a [`Payload`] view that
//! locates the payload once per event; anything else goes through
//! [`CtfEvent::raw_at`], the general path.

use std::sync::Arc;

use deepspan_model::{
    BlockRq, Comm, EventKind, Name, Packet as NetPacket, SchedSwitch, Tid, Value, Wakeup,
};

use crate::decode::{find_nul, read_bits, sign_extend};
use crate::event::{as_i64, as_u64, CtfEvent, Raw};
use crate::layout::{align_up, Direct};
use crate::metadata::{EventClass, Known, NO_PARAM, P};

/// The payload of one event as the typed mapping reads it.
pub(crate) struct Payload<'a> {
    event: &'a CtfEvent,
    class: &'a EventClass,
    data: &'a [u8],
    /// End of the readable bits: the packet's content, within `data`.
    end: u64,
    /// Bit position of the aligned payload start (None: beyond any
    /// address, so no field can be read directly).
    base: Option<u64>,
    direct: &'a [Direct],
}

impl<'a> Payload<'a> {
    /// The view of `event`'s payload; None when its class has none.
    #[inline(always)]
    pub fn of(event: &'a CtfEvent) -> Option<Payload<'a>> {
        let class = event.class();
        let scope = class.payload.as_ref()?;
        let packet = event.packet();
        let data = &packet.data[..];
        Some(Payload {
            event,
            class,
            data,
            end: packet.content_bits.min(data.len() as u64 * 8),
            base: align_up(event.payload_at(), scope.root_align),
            direct: &scope.direct,
        })
    }

    /// The field index of `p` in this payload.
    #[inline(always)]
    fn field(&self, p: P) -> Option<usize> {
        match self.class.params.get(p as usize) {
            Some(&i) if i != NO_PARAM => Some(i as usize),
            _ => None,
        }
    }

    /// Field `i` as an integer.
    #[inline(always)]
    pub fn int_at(&self, i: usize) -> Option<i64> {
        match self.direct.get(i) {
            Some(&Direct::Int {
                off,
                size,
                signed,
                be,
            }) => {
                let start = self.base?.checked_add(off)?;
                if start.checked_add(size as u64)? > self.end {
                    return None;
                }
                let v = read_int(self.data, start, size, be);
                Some(if signed {
                    sign_extend(v, size)
                } else {
                    v as i64
                })
            }
            Some(_) => self.int_walked(i),
            None => None, // no such field (`args` asks for six)
        }
    }

    #[inline(never)]
    fn int_walked(&self, i: usize) -> Option<i64> {
        match self.event.raw_at(i)? {
            Raw::Int(i) => Some(i),
            Raw::UInt(u) => Some(u as i64),
            Raw::Value(v) => as_i64(v),
            Raw::Text(_) | Raw::Str(_) => None,
        }
    }

    #[inline(always)]
    fn int(&self, p: P) -> Option<i64> {
        self.int_at(self.field(p)?)
    }

    /// Field `i` as a task name.
    pub fn comm_at(&self, i: usize) -> Option<Comm> {
        if let Some(&Direct::Text { off, len }) = self.direct.get(i) {
            // As `raw_at` reads a character array of a fixed layout.
            let from = (self.base?.checked_add(off)? / 8) as usize;
            let to = from.checked_add(len as usize)?.min((self.end / 8) as usize);
            return Some(Comm::from_bytes(self.data.get(from..to)?));
        }
        match self.event.raw_at(i)? {
            Raw::Text(b) => Some(Comm::from_bytes(b)),
            // As the decoded (lossy UTF-8) string would give it.
            Raw::Str(b) => Some(match std::str::from_utf8(b) {
                Ok(_) => Comm::from_bytes(b),
                Err(_) => Comm::from_bytes(String::from_utf8_lossy(b).as_bytes()),
            }),
            Raw::Value(Value::Str(s)) => Some(Comm::from_bytes(s.as_bytes())),
            Raw::Value(Value::Bytes(b)) => Some(Comm::from_bytes(b)),
            _ => None,
        }
    }

    fn comm(&self, p: P) -> Option<Comm> {
        self.comm_at(self.field(p)?)
    }

    /// Field `i` as text bytes (lossy UTF-8 is the caller's to apply).
    pub fn text_at(&self, i: usize) -> Option<&'a [u8]> {
        if let Some(&Direct::Str { off }) = self.direct.get(i) {
            // As `locate` finds a string after fields of fixed size.
            let from = (self.base?.checked_add(off)? / 8) as usize;
            let n = find_nul(self.data.get(from..(self.end / 8) as usize)?)?;
            return Some(&self.data[from..from + n]);
        }
        match self.event.raw_at(i)? {
            Raw::Text(b) | Raw::Str(b) => Some(b),
            Raw::Value(Value::Str(s)) => Some(s.as_bytes()),
            _ => None,
        }
    }

    fn text(&self, p: P) -> Option<&'a [u8]> {
        self.text_at(self.field(p)?)
    }

    /// A text field from a small vocabulary (irq handler, device names).
    fn name(&self, p: P) -> Option<Name> {
        self.text(p).map(Name::from_utf8_cached)
    }

    /// Positional syscall arguments; non-integer ones read as 0.
    fn args(&self) -> [u64; 6] {
        let mut args = [0u64; 6];
        for (i, slot) in args.iter_mut().enumerate() {
            *slot = self.int_at(i).unwrap_or(0) as u64;
        }
        args
    }

    fn wakeup(&self) -> Option<Wakeup> {
        Some(Wakeup {
            tid: self.int(P::Tid)? as Tid,
            comm: self.comm(P::Comm)?,
            prio: self.int(P::Prio)? as i32,
            target_cpu: self.int(P::TargetCpu).unwrap_or(-1) as i32,
        })
    }

    fn block_rq(&self) -> Option<BlockRq> {
        let rwbs = match self.field(P::Rwbs).and_then(|i| self.event.raw_at(i)) {
            Some(Raw::Int(v)) => rwbs_text(&Value::Int(v)),
            Some(Raw::UInt(v)) => rwbs_text(&Value::UInt(v)),
            Some(Raw::Text(b) | Raw::Str(b)) => {
                rwbs_text(&Value::Str(String::from_utf8_lossy(b).into_owned()))
            }
            Some(Raw::Value(v)) => rwbs_text(v),
            None => [0; 8],
        };
        Some(BlockRq {
            dev: self.int(P::Dev)? as u32,
            sector: self.int(P::Sector)? as u64,
            nr_sector: self.int(P::NrSector)? as u32,
            rwbs,
            error: self.int(P::Error).unwrap_or(0) as i32,
        })
    }

    fn net_packet(&self) -> Option<NetPacket> {
        Some(NetPacket {
            skbaddr: self.int(P::Skbaddr)? as u64,
            len: self.int(P::Len)? as u32,
            dev: self.name(P::NameDev).unwrap_or_else(|| Name::new("")),
        })
    }
}

/// The typed kind of `event`, or `None` when it has none or its fields do
/// not have the expected shape (the event then maps to
/// [`EventKind::Other`]).
#[inline(never)]
pub(crate) fn kind(event: &CtfEvent) -> Option<EventKind> {
    let known = &event.class().known;
    if let Known::SysUnknown = known {
        return sys_unknown(event);
    }
    let f = Payload::of(event)?;
    let k = match known {
        Known::Other | Known::SpanStart | Known::SpanEnd | Known::SysUnknown => return None,
        Known::SchedSwitch => EventKind::SchedSwitch(SchedSwitch {
            prev_comm: f.comm(P::PrevComm)?,
            prev_tid: f.int(P::PrevTid)? as Tid,
            prev_prio: f.int(P::PrevPrio)? as i32,
            prev_state: f.int(P::PrevState)?,
            next_comm: f.comm(P::NextComm)?,
            next_tid: f.int(P::NextTid)? as Tid,
            next_prio: f.int(P::NextPrio)? as i32,
        }),
        Known::SchedWaking => EventKind::SchedWaking(f.wakeup()?),
        Known::SchedWakeup => EventKind::SchedWakeup(f.wakeup()?),
        Known::SchedWakeupNew => EventKind::SchedWakeupNew(f.wakeup()?),
        Known::SchedProcessFork => EventKind::SchedProcessFork {
            parent_tid: f.int(P::ParentTid)? as Tid,
            parent_comm: f.comm(P::ParentComm)?,
            child_tid: f.int(P::ChildTid)? as Tid,
            child_comm: f.comm(P::ChildComm)?,
        },
        Known::SchedProcessExec => EventKind::SchedProcessExec {
            tid: f.int(P::Tid)? as Tid,
            old_tid: f.int(P::OldTid)? as Tid,
            // File names are not a small vocabulary: not interned.
            filename: Arc::from(String::from_utf8_lossy(f.text(P::Filename)?).as_ref()),
        },
        Known::SchedProcessExit => EventKind::SchedProcessExit {
            tid: f.int(P::Tid)? as Tid,
            comm: f.comm(P::Comm)?,
            prio: f.int(P::Prio)? as i32,
        },
        Known::SchedProcessFree => EventKind::SchedProcessFree {
            tid: f.int(P::Tid)? as Tid,
            comm: f.comm(P::Comm)?,
            prio: f.int(P::Prio)? as i32,
        },
        Known::SchedMigrateTask => EventKind::SchedMigrateTask {
            tid: f.int(P::Tid)? as Tid,
            comm: f.comm(P::Comm)?,
            prio: f.int(P::Prio)? as i32,
            orig_cpu: f.int(P::OrigCpu)? as i32,
            dest_cpu: f.int(P::DestCpu)? as i32,
        },
        Known::IrqHandlerEntry => EventKind::IrqHandlerEntry {
            irq: f.int(P::Irq)? as i32,
            name: f.name(P::Name).unwrap_or_else(|| Name::new("")),
        },
        Known::IrqHandlerExit => EventKind::IrqHandlerExit {
            irq: f.int(P::Irq)? as i32,
            ret: f.int(P::Ret)? as i32,
        },
        Known::SoftirqRaise => EventKind::SoftirqRaise {
            vec: f.int(P::Vec)? as u32,
        },
        Known::SoftirqEntry => EventKind::SoftirqEntry {
            vec: f.int(P::Vec)? as u32,
        },
        Known::SoftirqExit => EventKind::SoftirqExit {
            vec: f.int(P::Vec)? as u32,
        },
        Known::HrtimerExpireEntry => EventKind::HrtimerExpireEntry {
            hrtimer: f.int(P::Hrtimer)? as u64,
            function: f.int(P::Function).unwrap_or(0) as u64,
            now: f.int(P::Now).unwrap_or(0),
        },
        Known::HrtimerExpireExit => EventKind::HrtimerExpireExit {
            hrtimer: f.int(P::Hrtimer)? as u64,
        },
        Known::BlockRqInsert => EventKind::BlockRqInsert(f.block_rq()?),
        Known::BlockRqIssue => EventKind::BlockRqIssue(f.block_rq()?),
        Known::BlockRqComplete => EventKind::BlockRqComplete(f.block_rq()?),
        Known::NetDevQueue => EventKind::NetDevQueue(f.net_packet()?),
        Known::NetifReceiveSkb => EventKind::NetifReceiveSkb(f.net_packet()?),
        // Arguments are positional, in declaration order (futex: uaddr =
        // args[0]); non-integer arguments read as 0.
        Known::SysEnter(name) => EventKind::SysEnter {
            id: -1,
            name: Some(name.clone()),
            args: f.args(),
        },
        Known::SysExit(name) => EventKind::SysExit {
            id: -1,
            name: Some(name.clone()),
            ret: f.int(P::Ret).unwrap_or(0),
        },
        Known::SysExitUnnamed => EventKind::SysExit {
            id: -1,
            name: None,
            ret: f.int(P::Ret)?,
        },
    };
    Some(k)
}

/// Pre-2.6 LTTng `sys_unknown { id, args[6] }`.
fn sys_unknown(event: &CtfEvent) -> Option<EventKind> {
    let mut args = [0u64; 6];
    if let Some(Value::Array(a)) = event.field("args") {
        for (slot, v) in args.iter_mut().zip(a.iter()) {
            *slot = as_u64(v).unwrap_or(0);
        }
    }
    let id = Payload::of(event).and_then(|f| f.int(P::Id));
    Some(EventKind::SysEnter {
        id: id.unwrap_or(-1),
        name: None,
        args,
    })
}

/// An unsigned integer of `size` bits at bit `bit`: one load for the
/// common case (little endian, eight bytes readable), else [`read_bits`].
#[inline(always)]
fn read_int(data: &[u8], bit: u64, size: u8, be: bool) -> u64 {
    let at = (bit >> 3) as usize;
    let shift = (bit & 7) as u32;
    if !be && shift + size as u32 <= 64 {
        if let Some(bytes) = data.get(at..at + 8) {
            let v = u64::from_le_bytes(bytes.try_into().unwrap_or_default()) >> shift;
            return v & (u64::MAX >> (64 - size as u32));
        }
    }
    read_bits(data, bit, size, be)
}

/// lttng-modules encodes `rwbs` as a bit mask; the model wants ftrace's text.
fn rwbs_text(v: &Value) -> [u8; 8] {
    let mut out = [0u8; 8];
    let text: String = match v {
        Value::Str(s) => s.clone(),
        other => {
            let m = as_u64(other).unwrap_or(0);
            let bit = |b: u32| m & (1 << b) != 0;
            let mut s = String::new();
            if bit(10) {
                s.push('F'); // PREFLUSH
            }
            if bit(0) {
                s.push('W');
            } else if bit(1) {
                s.push('D');
            } else if bit(2) {
                s.push('R');
            } else {
                s.push('N');
            }
            for (b, c) in [(9, 'F'), (3, 'A'), (5, 'S'), (6, 'M')] {
                if bit(b) {
                    s.push(c);
                }
            }
            s
        }
    };
    let n = text.len().min(8);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CtfTrace;

    /// The typed mapping reads integers, character arrays and strings
    /// straight from the packet ([`Direct`]); on every event of the corpus,
    /// each read must give what the general decoder gives for that field.
    #[test]
    fn direct_reads_equal_decoded_fields() {
        let root = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/testdata/kernel/ctf"
        ));
        let mut checked = [0usize; 3];
        for dir in std::fs::read_dir(root).unwrap() {
            let trace = CtfTrace::open(dir.unwrap().path()).unwrap();
            for e in trace.events() {
                let e = e.unwrap();
                let Some(view) = Payload::of(&e) else {
                    continue;
                };
                let scope = e.class().payload.as_ref().unwrap();
                for (i, (direct, field)) in scope.direct.iter().zip(scope.fields()).enumerate() {
                    let decoded = e.field(&field.name);
                    match direct {
                        Direct::Int { .. } => {
                            assert_eq!(view.int_at(i), decoded.and_then(as_i64), "{e:?} field {i}");
                            checked[0] += 1;
                        }
                        Direct::Text { .. } => {
                            let Some(Value::Str(s)) = decoded else {
                                panic!("{e:?}: field {i} decodes as {decoded:?}")
                            };
                            let comm = view.comm_at(i).unwrap();
                            assert_eq!(comm, Comm::from_bytes(s.as_bytes()), "{e:?} field {i}");
                            checked[1] += 1;
                        }
                        Direct::Str { .. } => {
                            let Some(Value::Str(s)) = decoded else {
                                panic!("{e:?}: field {i} decodes as {decoded:?}")
                            };
                            let text = view.text_at(i).map(String::from_utf8_lossy);
                            assert_eq!(text.as_deref(), Some(s.as_str()), "{e:?} field {i}");
                            checked[2] += 1;
                        }
                        Direct::Walk => {}
                    }
                }
            }
        }
        assert!(
            checked[0] > 100_000 && checked[1] > 10_000 && checked[2] > 1_000,
            "{checked:?}"
        );
    }

    #[test]
    fn rwbs_mask_to_text() {
        let t = rwbs_text(&Value::UInt(1 | 1 << 5));
        assert_eq!(&t[..2], b"WS");
        let t = rwbs_text(&Value::UInt(1 << 2 | 1 << 3));
        assert_eq!(&t[..2], b"RA");
        let t = rwbs_text(&Value::Str("WFS".into()));
        assert_eq!(&t[..3], b"WFS");
    }
}
