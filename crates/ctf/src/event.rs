//! One decoded CTF event, its lazily materialized fields, and its mapping to
//! the typed model.

use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use deepspan_model::{
    BlockRq, Comm, Event, EventKind, Fields, Packet as NetPacket, SchedSwitch, Tid, Timestamped,
    Value, Wakeup,
};

use crate::decode::{sign_extend, Cursor, Walker};
use crate::layout::{self, align_up, Node};
use crate::metadata::{EventClass, Known};
use crate::stream::Packet;

/// An event of a CTF trace.
///
/// Timestamps: [`CtfEvent::ts`] is nanoseconds since the Unix epoch (the
/// trace clock's offset applied), the order [`crate::CtfTrace::events`]
/// follows and what `babeltrace2` prints. [`CtfEvent::monotonic_ns`] is the
/// raw clock value in nanoseconds (LTTng: CLOCK_MONOTONIC of the host), for
/// joining with spans that carry monotonic timestamps.
///
/// Fields are decoded only when asked for ([`CtfEvent::fields`]), then kept.
pub struct CtfEvent {
    ts: u64,
    ticks: u64,
    cpu: u32,
    tid: Option<Tid>,
    /// (prev_tid, next_tid) of a sched_switch, for tid inference.
    pub(crate) switch: Option<(Tid, Tid)>,
    class: Arc<EventClass>,
    packet: Arc<Packet>,
    /// Bit offsets in the packet of the event header and of the payload
    /// (before its alignment).
    start: u64,
    payload_at: u64,
    /// Boxed: keeps the event small while it moves through the merge.
    decoded: OnceLock<Box<Decoded>>,
}

/// A payload field value as the typed mapping needs it.
enum Raw<'a> {
    Int(i64),
    UInt(u64),
    Text(&'a [u8]),
    Value(&'a Value),
}

struct Decoded {
    context: Fields,
    fields: Fields,
}

/// A span start or end emitted through the LTTng-UST `jaeger_ust` provider
/// (the format of Gelle et al.: one event at each span start and end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpanSync {
    Start {
        trace_id: u128,
        span_id: u64,
        parent_span_id: u64,
        op_name: String,
        /// As emitted by the application (Jaeger: µs since the Unix epoch).
        start_time: u64,
        /// From the `vtid`/`vpid` context fields, when recorded.
        vtid: Option<Tid>,
        vpid: Option<i32>,
        /// Absolute ns of the event ([`CtfEvent::ts`]).
        ts: u64,
    },
    End {
        trace_id: u128,
        span_id: u64,
        /// As emitted by the application (Jaeger: µs).
        duration: u64,
        vtid: Option<Tid>,
        vpid: Option<i32>,
        ts: u64,
    },
}

impl std::fmt::Debug for CtfEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CtfEvent")
            .field("ts", &self.ts)
            .field("name", &self.name())
            .field("cpu", &self.cpu)
            .field("tid", &self.tid)
            .field("fields", self.fields())
            .finish()
    }
}

impl Timestamped for CtfEvent {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::UInt(u) => Some(*u as i64),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(*i as u64),
        Value::UInt(u) => Some(*u),
        _ => None,
    }
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

impl CtfEvent {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ts: u64,
        ticks: u64,
        cpu: u32,
        tid: Option<Tid>,
        switch: Option<(Tid, Tid)>,
        class: Arc<EventClass>,
        packet: Arc<Packet>,
        start: u64,
        payload_at: u64,
    ) -> CtfEvent {
        CtfEvent {
            ts,
            ticks,
            cpu,
            tid,
            switch,
            class,
            packet,
            start,
            payload_at,
            decoded: OnceLock::new(),
        }
    }

    /// Nanoseconds since the Unix epoch (clock offset applied).
    #[inline]
    pub fn ts(&self) -> u64 {
        self.ts
    }

    /// The trace clock value in nanoseconds, without the offset (for LTTng,
    /// CLOCK_MONOTONIC of the recording host).
    #[inline]
    pub fn monotonic_ns(&self) -> u64 {
        let meta = &self.packet.trace.meta;
        meta.clocks
            .get(self.packet.stream.clock)
            .map_or(self.ticks, |c| c.ticks_to_ns(self.ticks))
    }

    /// The raw clock value in clock ticks (`babeltrace2 --clock-cycles`).
    #[inline]
    pub fn clock_ticks(&self) -> u64 {
        self.ticks
    }

    /// CPU from the packet context `cpu_id`, or the `perf_cpu` field of
    /// perf-converted traces; 0 when the trace records neither.
    #[inline]
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// Thread id: the `tid` (else `vtid`) context field, the `perf_tid`
    /// field, or inferred per CPU from sched_switch (see
    /// [`crate::TraceInfo::tid_inferred`]); -1 when unknown.
    #[inline]
    pub fn tid(&self) -> Tid {
        self.tid.unwrap_or(-1)
    }

    pub(crate) fn tid_known(&self) -> bool {
        self.tid.is_some()
    }

    pub(crate) fn set_tid(&mut self, tid: Tid) {
        self.tid = Some(tid);
    }

    /// The event name as declared in the metadata (`sched_switch`,
    /// `jaeger_ust:start_span`, `sched:sched_switch` for perf).
    #[inline]
    pub fn name(&self) -> &str {
        &self.class.name
    }

    /// The shared name, cheap to keep.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.class.name
    }

    /// Event class id within its stream class.
    pub fn event_id(&self) -> u64 {
        self.class.id
    }

    pub fn loglevel(&self) -> Option<i64> {
        self.class.loglevel
    }

    /// Index of the trace in [`crate::CtfTrace::traces`].
    pub fn trace_index(&self) -> usize {
        self.packet.trace.index
    }

    /// Stream class id.
    pub fn stream_id(&self) -> u64 {
        self.packet.stream.id
    }

    /// Stream instance id from the packet header (LTTng), when present.
    pub fn stream_instance(&self) -> Option<u64> {
        self.packet.instance
    }

    /// File holding the event and byte offset of its header there.
    pub fn source(&self) -> (&Path, u64) {
        (&self.packet.path, self.packet.offset + self.start / 8)
    }

    fn decoded(&self) -> &Decoded {
        self.decoded.get_or_init(|| Box::new(self.decode()))
    }

    /// Payload fields in declaration order, names without the leading
    /// underscore; nested structs flattened as `outer.inner`, a variant as
    /// its selected option under the variant's name; enumerations as their integer value; character
    /// arrays and sequences as strings (up to the first NUL).
    pub fn fields(&self) -> &Fields {
        &self.decoded().fields
    }

    /// Stream event context then event context fields (e.g. `vtid`, `vpid`,
    /// `procname`), flattened like [`CtfEvent::fields`].
    pub fn context(&self) -> &Fields {
        &self.decoded().context
    }

    /// Packet context fields (`timestamp_begin`, `content_size`, `cpu_id`...).
    pub fn packet_context(&self) -> &Fields {
        &self.packet.context
    }

    /// A payload field by (flattened) name.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.fields()
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }

    /// A context field by name.
    pub fn context_field(&self, name: &str) -> Option<&Value> {
        self.context()
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| v)
    }

    /// The label of a top-level enumeration payload field's current value.
    pub fn enum_label(&self, name: &str) -> Option<&str> {
        let payload = self.class.payload.as_ref()?;
        let f = payload.fields().iter().find(|f| &*f.name == name)?;
        let Node::Enum(int, ranges) = &f.node else {
            return None;
        };
        let v = self.field(name)?;
        let v: i128 = if int.signed {
            as_i64(v)? as i128
        } else {
            as_u64(v)? as i128
        };
        ranges
            .iter()
            .find(|r| r.lo <= v && v <= r.hi)
            .map(|r| &*r.label)
    }

    /// Decodes again from the event start, this time building values. The
    /// iteration already walked these bytes successfully, so this cannot
    /// fail on real data; if it somehow does, the fields decoded so far are
    /// kept.
    fn decode(&self) -> Decoded {
        thread_local! {
            // Reused between events: decoding then allocates only its output.
            static SCRATCH: RefCell<Walker> = RefCell::new(Walker::new());
        }
        SCRATCH.with(|w| match w.try_borrow_mut() {
            Ok(mut w) => self.decode_with(&mut w),
            Err(_) => self.decode_with(&mut Walker::new()),
        })
    }

    fn decode_with(&self, w: &mut Walker) -> Decoded {
        let p = &self.packet;
        let field_count = |s: Option<&crate::layout::Scope>| s.map_or(0, |s| s.fields().len());
        let mut out = Decoded {
            context: Fields::with_capacity(
                field_count(p.stream.event_context.as_ref())
                    + field_count(self.class.context.as_ref()),
            ),
            fields: Fields::with_capacity(field_count(self.class.payload.as_ref())),
        };
        for (scope, values) in [
            (layout::PACKET_HEADER, &p.header_slots),
            (layout::PACKET_CONTEXT, &p.context_slots),
        ] {
            let slots = &mut w.slots[scope as usize];
            slots.clear();
            slots.extend_from_slice(values);
        }
        let mut cur = Cursor::new(&p.data, self.start, p.content_bits);
        let _ = (|| {
            if let Some(h) = &p.stream.event_header {
                w.reserve(layout::EVENT_HEADER, h.slots);
                w.run(&h.ops, layout::EVENT_HEADER, &mut cur)?;
            }
            if let Some(c) = &p.stream.event_context {
                w.reserve(layout::STREAM_EVENT_CONTEXT, c.slots);
                w.flatten(
                    &c.root,
                    layout::STREAM_EVENT_CONTEXT,
                    &mut cur,
                    &mut out.context,
                )?;
            }
            if let Some(c) = &self.class.context {
                w.reserve(layout::EVENT_CONTEXT, c.slots);
                w.flatten(&c.root, layout::EVENT_CONTEXT, &mut cur, &mut out.context)?;
            }
            if let Some(c) = &self.class.payload {
                w.reserve(layout::PAYLOAD, c.slots);
                w.flatten(&c.root, layout::PAYLOAD, &mut cur, &mut out.fields)?;
            }
            Ok::<(), crate::decode::DecodeError>(())
        })();
        out
    }

    fn get(&self, names: &[&str]) -> Option<&Value> {
        names.iter().find_map(|n| self.field(n))
    }

    /// A top-level payload field read straight from the packet when the
    /// payload has a fixed layout (most kernel events), else from
    /// [`CtfEvent::fields`]: typed mapping then costs no allocation.
    fn raw(&self, names: &[&str]) -> Option<Raw<'_>> {
        if let Some(p) = &self.class.payload {
            if p.offsets.is_some() {
                let i = names
                    .iter()
                    .find_map(|n| p.fields().iter().position(|f| &*f.name == *n))?;
                return self.raw_at(i);
            }
        }
        self.get(names).map(Raw::Value)
    }

    /// Field `i` of the payload (see [`CtfEvent::raw`]).
    fn raw_at(&self, i: usize) -> Option<Raw<'_>> {
        let p = self.class.payload.as_ref()?;
        let f = p.fields().get(i)?;
        let Some(offsets) = &p.offsets else {
            return self
                .fields()
                .iter()
                .find(|(n, _)| *n == f.path)
                .map(|(_, v)| Raw::Value(v));
        };
        let start = align_up(self.payload_at, p.root.align())?.checked_add(*offsets.get(i)?)?;
        let data = &self.packet.data[..];
        let mut cur = Cursor::new(data, start, self.packet.content_bits);
        match &f.node {
            Node::Int(n) | Node::Enum(n, _) => {
                cur.align(n.align).ok()?;
                let v = cur.read(n.size, n.be).ok()?;
                Some(if n.signed {
                    Raw::Int(sign_extend(v, n.size))
                } else {
                    Raw::UInt(v)
                })
            }
            Node::Array(a) if a.text && start % 8 == 0 && a.elem.align() <= 8 => {
                let from = (start / 8) as usize;
                let end = from.checked_add(a.len as usize)?;
                let bytes = data.get(from..end.min((self.packet.content_bits / 8) as usize))?;
                let upto = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                Some(Raw::Text(&bytes[..upto]))
            }
            _ => self
                .fields()
                .iter()
                .find(|(n, _)| *n == f.path)
                .map(|(_, v)| Raw::Value(v)),
        }
    }

    fn int(&self, names: &[&str]) -> Option<i64> {
        match self.raw(names)? {
            Raw::Int(i) => Some(i),
            Raw::UInt(u) => Some(u as i64),
            Raw::Value(v) => as_i64(v),
            Raw::Text(_) => None,
        }
    }

    fn comm(&self, names: &[&str]) -> Option<Comm> {
        match self.raw(names)? {
            Raw::Text(b) => Some(Comm::from_bytes(b)),
            Raw::Value(Value::Str(s)) => Some(Comm::from_bytes(s.as_bytes())),
            Raw::Value(Value::Bytes(b)) => Some(Comm::from_bytes(b)),
            _ => None,
        }
    }

    fn text(&self, names: &[&str]) -> Option<Arc<str>> {
        match self.raw(names)? {
            Raw::Text(b) => Some(Arc::from(String::from_utf8_lossy(b).as_ref())),
            Raw::Value(Value::Str(s)) => Some(Arc::from(s.as_str())),
            _ => None,
        }
    }

    /// Positional syscall arguments; non-integer ones read as 0.
    fn args(&self) -> [u64; 6] {
        let mut args = [0u64; 6];
        for (i, slot) in args.iter_mut().enumerate() {
            *slot = match self.raw_at(i) {
                Some(Raw::Int(v)) => v as u64,
                Some(Raw::UInt(v)) => v,
                Some(Raw::Value(v)) => as_u64(v).unwrap_or(0),
                _ => 0,
            };
        }
        args
    }

    fn wakeup(&self) -> Option<Wakeup> {
        Some(Wakeup {
            tid: self.int(&["tid", "pid"])? as Tid,
            comm: self.comm(&["comm"])?,
            prio: self.int(&["prio"])? as i32,
            target_cpu: self.int(&["target_cpu"]).unwrap_or(-1) as i32,
        })
    }

    fn block_rq(&self) -> Option<BlockRq> {
        Some(BlockRq {
            dev: self.int(&["dev"])? as u32,
            sector: self.int(&["sector"])? as u64,
            nr_sector: self.int(&["nr_sector"])? as u32,
            rwbs: match self.raw(&["rwbs"]) {
                Some(Raw::Int(v)) => rwbs_text(&Value::Int(v)),
                Some(Raw::UInt(v)) => rwbs_text(&Value::UInt(v)),
                Some(Raw::Text(b)) => {
                    rwbs_text(&Value::Str(String::from_utf8_lossy(b).into_owned()))
                }
                Some(Raw::Value(v)) => rwbs_text(v),
                None => [0; 8],
            },
            error: self.int(&["error", "errors"]).unwrap_or(0) as i32,
        })
    }

    fn net_packet(&self) -> Option<NetPacket> {
        Some(NetPacket {
            skbaddr: self.int(&["skbaddr"])? as u64,
            len: self.int(&["len"])? as u32,
            dev: self.text(&["name", "dev"]).unwrap_or_else(|| Arc::from("")),
        })
    }

    /// The typed kind, or `None` when the fields do not have the expected
    /// shape (the event then maps to [`EventKind::Other`]).
    fn kind(&self) -> Option<EventKind> {
        let k = match &self.class.known {
            Known::Other | Known::SpanStart | Known::SpanEnd => return None,
            Known::SchedSwitch => EventKind::SchedSwitch(SchedSwitch {
                prev_comm: self.comm(&["prev_comm"])?,
                prev_tid: self.int(&["prev_tid", "prev_pid"])? as Tid,
                prev_prio: self.int(&["prev_prio"])? as i32,
                prev_state: self.int(&["prev_state"])?,
                next_comm: self.comm(&["next_comm"])?,
                next_tid: self.int(&["next_tid", "next_pid"])? as Tid,
                next_prio: self.int(&["next_prio"])? as i32,
            }),
            Known::SchedWaking => EventKind::SchedWaking(self.wakeup()?),
            Known::SchedWakeup => EventKind::SchedWakeup(self.wakeup()?),
            Known::SchedWakeupNew => EventKind::SchedWakeupNew(self.wakeup()?),
            Known::SchedProcessFork => EventKind::SchedProcessFork {
                parent_tid: self.int(&["parent_tid", "parent_pid"])? as Tid,
                parent_comm: self.comm(&["parent_comm"])?,
                child_tid: self.int(&["child_tid", "child_pid"])? as Tid,
                child_comm: self.comm(&["child_comm"])?,
            },
            Known::SchedProcessExec => EventKind::SchedProcessExec {
                tid: self.int(&["tid", "pid"])? as Tid,
                old_tid: self.int(&["old_tid", "old_pid"])? as Tid,
                filename: self.text(&["filename"])?,
            },
            Known::SchedProcessExit => EventKind::SchedProcessExit {
                tid: self.int(&["tid", "pid"])? as Tid,
                comm: self.comm(&["comm"])?,
                prio: self.int(&["prio"])? as i32,
            },
            Known::SchedProcessFree => EventKind::SchedProcessFree {
                tid: self.int(&["tid", "pid"])? as Tid,
                comm: self.comm(&["comm"])?,
                prio: self.int(&["prio"])? as i32,
            },
            Known::SchedMigrateTask => EventKind::SchedMigrateTask {
                tid: self.int(&["tid", "pid"])? as Tid,
                comm: self.comm(&["comm"])?,
                prio: self.int(&["prio"])? as i32,
                orig_cpu: self.int(&["orig_cpu"])? as i32,
                dest_cpu: self.int(&["dest_cpu"])? as i32,
            },
            Known::IrqHandlerEntry => EventKind::IrqHandlerEntry {
                irq: self.int(&["irq"])? as i32,
                name: self.text(&["name"]).unwrap_or_else(|| Arc::from("")),
            },
            Known::IrqHandlerExit => EventKind::IrqHandlerExit {
                irq: self.int(&["irq"])? as i32,
                ret: self.int(&["ret"])? as i32,
            },
            Known::SoftirqRaise => EventKind::SoftirqRaise {
                vec: self.int(&["vec"])? as u32,
            },
            Known::SoftirqEntry => EventKind::SoftirqEntry {
                vec: self.int(&["vec"])? as u32,
            },
            Known::SoftirqExit => EventKind::SoftirqExit {
                vec: self.int(&["vec"])? as u32,
            },
            Known::HrtimerExpireEntry => EventKind::HrtimerExpireEntry {
                hrtimer: self.int(&["hrtimer"])? as u64,
                function: self.int(&["function"]).unwrap_or(0) as u64,
                now: self.int(&["now"]).unwrap_or(0),
            },
            Known::HrtimerExpireExit => EventKind::HrtimerExpireExit {
                hrtimer: self.int(&["hrtimer"])? as u64,
            },
            Known::BlockRqInsert => EventKind::BlockRqInsert(self.block_rq()?),
            Known::BlockRqIssue => EventKind::BlockRqIssue(self.block_rq()?),
            Known::BlockRqComplete => EventKind::BlockRqComplete(self.block_rq()?),
            Known::NetDevQueue => EventKind::NetDevQueue(self.net_packet()?),
            Known::NetifReceiveSkb => EventKind::NetifReceiveSkb(self.net_packet()?),
            Known::SysEnter(name) => {
                // Arguments are positional, in declaration order (futex:
                // uaddr = args[0]); non-integer arguments read as 0.
                EventKind::SysEnter {
                    id: -1,
                    name: Some(name.clone()),
                    args: self.args(),
                }
            }
            Known::SysExit(name) => EventKind::SysExit {
                id: -1,
                name: Some(name.clone()),
                ret: self.int(&["ret"]).unwrap_or(0),
            },
            Known::SysExitUnnamed => EventKind::SysExit {
                id: -1,
                name: None,
                ret: self.int(&["ret"])?,
            },
            Known::SysUnknown => {
                let mut args = [0u64; 6];
                if let Some(Value::Array(a)) = self.field("args") {
                    for (slot, v) in args.iter_mut().zip(a.iter()) {
                        *slot = as_u64(v).unwrap_or(0);
                    }
                }
                EventKind::SysEnter {
                    id: self.int(&["id"]).unwrap_or(-1),
                    name: None,
                    args,
                }
            }
        };
        Some(k)
    }

    /// The event in the shared model. `Event::ts` is [`CtfEvent::ts`]
    /// (absolute ns): the same order as this reader's iteration and
    /// comparable across the traces of a folder and with wall-clock span
    /// timestamps; use [`CtfEvent::monotonic_ns`] to join with spans that
    /// carry CLOCK_MONOTONIC. Events without a typed form (and typed events
    /// with unexpected fields) become [`EventKind::Other`] with the full name.
    pub fn to_event(&self) -> Event {
        let kind = self.kind().unwrap_or_else(|| EventKind::Other {
            name: self.class.name.clone(),
        });
        Event {
            ts: self.ts,
            cpu: self.cpu,
            tid: self.tid(),
            kind,
        }
    }

    /// The span start/end carried by a `jaeger_ust:start_span` or
    /// `jaeger_ust:end_span` event; `None` for any other event or when a
    /// field is missing.
    pub fn span_sync(&self) -> Option<SpanSync> {
        let u = |n: &str| self.field(n).and_then(as_u64);
        let ctx = |n: &str| self.context_field(n).and_then(as_i64).map(|v| v as i32);
        let trace_id = || Some((u("trace_id_high")? as u128) << 64 | u("trace_id_low")? as u128);
        match self.class.known {
            Known::SpanStart => Some(SpanSync::Start {
                trace_id: trace_id()?,
                span_id: u("span_id")?,
                parent_span_id: u("parent_span_id")?,
                op_name: match self.field("op_name")? {
                    Value::Str(s) => s.clone(),
                    _ => return None,
                },
                start_time: u("start_time")?,
                vtid: ctx("vtid"),
                vpid: ctx("vpid"),
                ts: self.ts,
            }),
            Known::SpanEnd => Some(SpanSync::End {
                trace_id: trace_id()?,
                span_id: u("span_id")?,
                duration: u("duration")?,
                vtid: ctx("vtid"),
                vpid: ctx("vpid"),
                ts: self.ts,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
