//! One decoded CTF event, its lazily materialized fields, and its mapping to
//! the typed model.

use std::cell::RefCell;
use std::cell::UnsafeCell;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

use deepspan_model::{Event, EventKind, Fields, Name, Tid, Timestamped, Value};

use crate::decode::{sign_extend, Cursor, Walker};
use crate::layout::{self, align_up, Node};
use crate::metadata::{EventClass, Known};
use crate::share::PacketRef;
use crate::stream::{Chunk, Packet};
use crate::typed::{self, Payload};

/// An event of a CTF trace.
///
/// Timestamps: [`CtfEvent::ts`] is nanoseconds since the Unix epoch (the
/// trace clock's offset applied), the order [`crate::CtfTrace::events`]
/// follows and what `babeltrace2` prints. [`CtfEvent::monotonic_ns`] is the
/// raw clock value in nanoseconds (LTTng: CLOCK_MONOTONIC of the host), for
/// joining with spans that carry monotonic timestamps.
///
/// Fields are decoded only when asked for ([`CtfEvent::fields`]), then kept.
///
/// A small handle (16 bytes, moved cheaply through the merge): what was
/// decoded of the event is record `idx` of a chunk of records, which it
/// shares with the events decoded with it (and which keeps the bytes of
/// the packet alive).
pub struct CtfEvent {
    chunk: PacketRef<Chunk>,
    /// A whole word, not a `u32`: the event is moved as two words, and a
    /// half-word store read back as a word stalls the CPU.
    idx: usize,
}

const PAYLOAD_FAR: u32 = u32::MAX;

/// A payload field value as the typed mapping needs it.
pub(crate) enum Raw<'a> {
    Int(i64),
    UInt(u64),
    /// A character array read raw, up to its first NUL.
    Text(&'a [u8]),
    /// A string (or a character array of a payload without fixed layout):
    /// what its decoded value would be before lossy UTF-8 conversion.
    Str(&'a [u8]),
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
            .field("ts", &self.ts())
            .field("name", &self.name())
            .field("cpu", &self.cpu())
            .field("tid", &self.tid_opt())
            .field("fields", self.fields())
            .finish()
    }
}

impl Timestamped for CtfEvent {
    fn timestamp(&self) -> u64 {
        self.ts()
    }
}

pub(crate) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::UInt(u) => Some(*u as i64),
        _ => None,
    }
}

pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => Some(*i as u64),
        Value::UInt(u) => Some(*u),
        _ => None,
    }
}

/// What is known of an event once decoded (see `StreamEvents::fill`). It
/// belongs to the one [`CtfEvent`] made of it.
pub(crate) struct Record {
    ts: u64,
    ticks: u64,
    /// The event class (kept alive by the window, which holds the stream
    /// class, which holds its event classes).
    class: NonNull<EventClass>,
    /// Bit offset in the window of the event header.
    start: u64,
    cpu: u32,
    /// Bit offset of the payload (before its alignment) from `start`;
    /// [`PAYLOAD_FAR`] when it does not fit (then found again on demand).
    payload_delta: u32,
    /// Written only through `&mut CtfEvent` (tid inference).
    tid: UnsafeCell<Option<Tid>>,
    /// The decoded fields once asked for (a `Box<Decoded>`), else null;
    /// freed with the event.
    decoded: AtomicPtr<Decoded>,
}

// SAFETY: `class` points into an immutable `EventClass` (Send + Sync);
// `tid` is written only by the owner of the one event made of the record
// (through `&mut`), `decoded` is published atomically.
unsafe impl Send for Record {}
unsafe impl Sync for Record {}

impl Record {
    #[inline(always)]
    pub fn ts(&self) -> u64 {
        self.ts
    }

    #[inline(always)]
    pub fn new(
        ts: u64,
        ticks: u64,
        cpu: u32,
        tid: Option<Tid>,
        class: &EventClass,
        start: u64,
        payload_at: u64,
    ) -> Record {
        Record {
            ts,
            ticks,
            class: NonNull::from(class),
            start,
            cpu,
            payload_delta: payload_delta(start, payload_at),
            tid: UnsafeCell::new(tid),
            decoded: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

#[inline(always)]
fn payload_delta(start: u64, payload_at: u64) -> u32 {
    match u32::try_from(payload_at - start) {
        Ok(d) if d != PAYLOAD_FAR => d,
        _ => PAYLOAD_FAR,
    }
}

impl Drop for CtfEvent {
    #[inline]
    fn drop(&mut self) {
        let decoded = &self.rec().decoded;
        let p = decoded.load(Ordering::Relaxed);
        if !p.is_null() {
            decoded.store(std::ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: set once from Box::into_raw, owned by this event,
            // which no one else can see any more.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl CtfEvent {
    /// The event of record `idx` of `chunk`.
    ///
    /// # Safety
    /// Record `idx` must be initialized, and no other event made of it.
    #[inline(always)]
    pub(crate) unsafe fn from_chunk(chunk: PacketRef<Chunk>, idx: u32) -> CtfEvent {
        CtfEvent {
            chunk,
            idx: idx as usize,
        }
    }

    #[inline(always)]
    fn rec(&self) -> &Record {
        // SAFETY: initialized before this event was made (see `from_chunk`).
        unsafe { self.chunk.get().record(self.idx as u32) }
    }

    /// Bit offset in the packet of the payload (before its alignment).
    #[inline(always)]
    pub(crate) fn payload_at(&self) -> u64 {
        let r = self.rec();
        if r.payload_delta != PAYLOAD_FAR {
            return r.start + r.payload_delta as u64;
        }
        self.payload_at_far()
    }

    /// [`CtfEvent::payload_at`] for headers and contexts over 512 MiB:
    /// walks them again.
    #[cold]
    fn payload_at_far(&self) -> u64 {
        let r = self.rec();
        let p = self.packet();
        let mut w = Walker::new();
        w.slots[layout::PACKET_HEADER as usize].clone_from(&p.info.header_slots);
        w.slots[layout::PACKET_CONTEXT as usize].clone_from(&p.info.context_slots);
        let mut cur = Cursor::new(&p.data, r.start, p.content_bits);
        let scopes = [
            (p.info.stream.event_header.as_ref(), layout::EVENT_HEADER),
            (
                p.info.stream.event_context.as_ref(),
                layout::STREAM_EVENT_CONTEXT,
            ),
            (self.class().context.as_ref(), layout::EVENT_CONTEXT),
        ];
        for (scope, id) in scopes {
            if let Some(s) = scope {
                w.reserve(id, s.slots);
                if w.run(&s.ops, id, &mut cur).is_err() {
                    break;
                }
            }
        }
        cur.pos
    }

    /// (prev_tid, next_tid) when the payload has both (sched_switch), for
    /// tid inference.
    #[inline(always)]
    pub(crate) fn switch(&self) -> Option<(Tid, Tid)> {
        let (prev, next) = self.class().switch_fields?;
        let payload = Payload::of(self)?;
        Some((payload.int_at(prev)? as Tid, payload.int_at(next)? as Tid))
    }

    #[inline(always)]
    pub(crate) fn packet(&self) -> &Packet {
        &self.chunk.get().window
    }

    #[inline(always)]
    pub(crate) fn class(&self) -> &EventClass {
        // SAFETY: the class lives in an `Arc` held by the stream class,
        // which the window holds, which the chunk holds, which this event
        // holds; it is never modified after the metadata is compiled.
        unsafe { self.rec().class.as_ref() }
    }

    #[inline(always)]
    fn tid_opt(&self) -> Option<Tid> {
        // SAFETY: written only through `&mut self` (see `Record::tid`).
        unsafe { *self.rec().tid.get() }
    }

    /// Nanoseconds since the Unix epoch (clock offset applied).
    #[inline]
    pub fn ts(&self) -> u64 {
        self.rec().ts
    }

    /// The trace clock value in nanoseconds, without the offset (for LTTng,
    /// CLOCK_MONOTONIC of the recording host).
    #[inline]
    pub fn monotonic_ns(&self) -> u64 {
        let meta = &self.packet().info.trace.meta;
        meta.clocks
            .get(self.packet().info.stream.clock)
            .map_or(self.rec().ticks, |c| c.ticks_to_ns(self.rec().ticks))
    }

    /// The raw clock value in clock ticks (`babeltrace2 --clock-cycles`).
    #[inline]
    pub fn clock_ticks(&self) -> u64 {
        self.rec().ticks
    }

    /// CPU from the packet context `cpu_id`, or the `perf_cpu` field of
    /// perf-converted traces; 0 when the trace records neither.
    #[inline]
    pub fn cpu(&self) -> u32 {
        self.rec().cpu
    }

    /// Thread id: the `tid` (else `vtid`) context field, the `perf_tid`
    /// field, or inferred per CPU from sched_switch (see
    /// [`crate::TraceInfo::tid_inferred`]); -1 when unknown.
    #[inline]
    pub fn tid(&self) -> Tid {
        self.tid_opt().unwrap_or(-1)
    }

    #[inline(always)]
    pub(crate) fn tid_known(&self) -> bool {
        self.tid_opt().is_some()
    }

    #[inline(always)]
    pub(crate) fn set_tid(&mut self, tid: Tid) {
        // SAFETY: `&mut self`: no one else looks at this event's record.
        unsafe { *self.rec().tid.get() = Some(tid) };
    }

    /// The event name as declared in the metadata (`sched_switch`,
    /// `jaeger_ust:start_span`, `sched:sched_switch` for perf).
    #[inline]
    pub fn name(&self) -> &str {
        &self.class().name
    }

    /// The name as kept by every event of the class, free to clone.
    pub fn shared_name(&self) -> &Name {
        &self.class().name
    }

    /// A dense key of the event's class within its [`crate::CtfTrace`]:
    /// below [`crate::CtfTrace::class_count`], named by
    /// [`crate::CtfTrace::class_name`] (cheaper than hashing a name per
    /// event for per-class tables).
    #[inline]
    pub fn class_index(&self) -> usize {
        self.packet().info.trace.class_base + self.class().seq as usize
    }

    /// Event class id within its stream class.
    pub fn event_id(&self) -> u64 {
        self.class().id
    }

    pub fn loglevel(&self) -> Option<i64> {
        self.class().loglevel
    }

    /// Index of the trace in [`crate::CtfTrace::traces`].
    pub fn trace_index(&self) -> usize {
        self.packet().info.trace.index
    }

    /// Stream class id.
    pub fn stream_id(&self) -> u64 {
        self.packet().info.stream.id
    }

    /// Stream instance id from the packet header (LTTng), when present.
    pub fn stream_instance(&self) -> Option<u64> {
        self.packet().info.instance
    }

    /// File holding the event and byte offset of its header there.
    pub fn source(&self) -> (&Path, u64) {
        (
            &self.packet().info.path,
            self.packet().offset() + self.rec().start / 8,
        )
    }

    fn decoded(&self) -> &Decoded {
        let decoded = &self.rec().decoded;
        let p = decoded.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: set once from Box::into_raw, freed only on drop.
            return unsafe { &*p };
        }
        let fresh = Box::into_raw(Box::new(self.decode()));
        match decoded.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; freed only on drop.
            Ok(_) => unsafe { &*fresh },
            Err(other) => {
                // Another thread decoded it first: keep theirs.
                // SAFETY: `fresh` was never shared; `other` as above.
                drop(unsafe { Box::from_raw(fresh) });
                unsafe { &*other }
            }
        }
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
        &self.packet().info.context
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
        let payload = self.class().payload.as_ref()?;
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
        let p = self.packet();
        let field_count = |s: Option<&crate::layout::Scope>| s.map_or(0, |s| s.fields().len());
        let mut out = Decoded {
            context: Fields::with_capacity(
                field_count(p.info.stream.event_context.as_ref())
                    + field_count(self.class().context.as_ref()),
            ),
            fields: Fields::with_capacity(field_count(self.class().payload.as_ref())),
        };
        for (scope, values) in [
            (layout::PACKET_HEADER, &p.info.header_slots),
            (layout::PACKET_CONTEXT, &p.info.context_slots),
        ] {
            let slots = &mut w.slots[scope as usize];
            slots.clear();
            slots.extend_from_slice(values);
        }
        let mut cur = Cursor::new(&p.data, self.rec().start, p.content_bits);
        let _ = (|| {
            if let Some(h) = &p.info.stream.event_header {
                w.reserve(layout::EVENT_HEADER, h.slots);
                w.run(&h.ops, layout::EVENT_HEADER, &mut cur)?;
            }
            if let Some(c) = &p.info.stream.event_context {
                w.reserve(layout::STREAM_EVENT_CONTEXT, c.slots);
                w.flatten(
                    &c.root,
                    layout::STREAM_EVENT_CONTEXT,
                    &mut cur,
                    &mut out.context,
                )?;
            }
            if let Some(c) = &self.class().context {
                w.reserve(layout::EVENT_CONTEXT, c.slots);
                w.flatten(&c.root, layout::EVENT_CONTEXT, &mut cur, &mut out.context)?;
            }
            if let Some(c) = &self.class().payload {
                w.reserve(layout::PAYLOAD, c.slots);
                w.flatten(&c.root, layout::PAYLOAD, &mut cur, &mut out.fields)?;
            }
            Ok::<(), crate::decode::DecodeError>(())
        })();
        out
    }

    /// Top-level payload field `i` the general way, for the typed mapping
    /// ([`crate::typed`]) where the layout does not say where it is: from
    /// the packet when its place can be found by walking the fields before
    /// it, else from the decoded fields.
    pub(crate) fn raw_at(&self, i: usize) -> Option<Raw<'_>> {
        let p = self.class().payload.as_ref()?;
        let f = p.fields().get(i)?;
        let Some(offsets) = &p.offsets else {
            if let Some(r) = self.locate(i) {
                return r;
            }
            return self
                .fields()
                .iter()
                .find(|(n, _)| *n == f.path)
                .map(|(_, v)| Raw::Value(v));
        };
        let start = align_up(self.payload_at(), p.root_align)?.checked_add(*offsets.get(i)?)?;
        let packet = self.packet();
        let data = &packet.data[..];
        match &f.node {
            Node::Int(n) | Node::Enum(n, _) => {
                // Offsets of a fixed layout are aligned already.
                let end = packet.content_bits.min(data.len() as u64 * 8);
                if start.checked_add(n.size as u64)? > end {
                    return None;
                }
                let v = crate::decode::read_bits(data, start, n.size, n.be);
                Some(if n.signed {
                    Raw::Int(sign_extend(v, n.size))
                } else {
                    Raw::UInt(v)
                })
            }
            Node::Array(a) if a.text && start % 8 == 0 && a.elem.align() <= 8 => {
                let from = (start / 8) as usize;
                let end = from.checked_add(a.len as usize)?;
                let bytes = data.get(from..end.min((self.packet().content_bits / 8) as usize))?;
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

    /// Field `i` of a payload without fixed layout, found by walking the
    /// fields before it when they are simple (integers, floats, strings,
    /// fixed-size arrays and structs): Some(value or None when it has no
    /// scalar value), or None when it cannot be found that way.
    fn locate(&self, i: usize) -> Option<Option<Raw<'_>>> {
        let p = self.class().payload.as_ref()?;
        let packet = self.packet();
        let data = &packet.data[..];
        let end = packet.content_bits.min(data.len() as u64 * 8);
        let mut pos = align_up(self.payload_at(), p.root_align)?;
        let fits = |pos: u64, bits: u64| pos.checked_add(bits).filter(|e| *e <= end);
        for (j, f) in p.fields().iter().enumerate().take(i + 1) {
            let here = j == i;
            match &f.node {
                Node::Int(n) | Node::Enum(n, _) => {
                    pos = align_up(pos, n.align)?;
                    let next = fits(pos, n.size as u64)?;
                    if here {
                        let v = Cursor::new(data, pos, end).read(n.size, n.be).ok()?;
                        return Some(Some(if n.signed {
                            Raw::Int(sign_extend(v, n.size))
                        } else {
                            Raw::UInt(v)
                        }));
                    }
                    pos = next;
                }
                Node::Float { double, align, .. } => {
                    pos = align_up(pos, *align)?;
                    pos = fits(pos, if *double { 64 } else { 32 })?;
                    if here {
                        return Some(None);
                    }
                }
                Node::Str => {
                    pos = align_up(pos, 8)?;
                    let from = (pos / 8) as usize;
                    let n = crate::decode::find_nul(data.get(from..(end / 8) as usize)?)?;
                    if here {
                        return Some(Some(Raw::Str(&data[from..from + n])));
                    }
                    pos = ((from + n + 1) * 8) as u64;
                }
                Node::Array(a) if a.skip.is_some() => {
                    pos = align_up(pos, a.elem.align())?;
                    let bits = a.skip?;
                    let next = fits(pos, bits)?;
                    if here {
                        if !(a.text && pos % 8 == 0 && a.elem.align() <= 8) {
                            return None;
                        }
                        let from = (pos / 8) as usize;
                        let bytes = data.get(from..from + a.len as usize)?;
                        let upto = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                        return Some(Some(Raw::Str(&bytes[..upto])));
                    }
                    pos = next;
                }
                Node::Struct(s) if s.skip.is_some() && !here => {
                    pos = align_up(pos, s.align)?;
                    pos = fits(pos, s.skip?)?;
                }
                _ => return None,
            }
        }
        None
    }

    /// The event in the shared model. `Event::ts` is [`CtfEvent::ts`]
    /// (absolute ns): the same order as this reader's iteration and
    /// comparable across the traces of a folder and with wall-clock span
    /// timestamps; use [`CtfEvent::monotonic_ns`] to join with spans that
    /// carry CLOCK_MONOTONIC. Events without a typed form (and typed events
    /// with unexpected fields) become [`EventKind::Other`] with the full name.
    #[inline]
    pub fn to_event(&self) -> Event {
        // Inlined into the caller for the common untyped case, so that the
        // event is built in place.
        let kind = match self.class().known {
            Known::Other | Known::SpanStart | Known::SpanEnd => None,
            _ => typed::kind(self),
        };
        let kind = kind.unwrap_or_else(|| EventKind::Other {
            name: self.class().name.clone(),
        });
        Event {
            ts: self.ts(),
            cpu: self.cpu(),
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
        match self.class().known {
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
                ts: self.ts(),
            }),
            Known::SpanEnd => Some(SpanSync::End {
                trace_id: trace_id()?,
                span_id: u("span_id")?,
                duration: u("duration")?,
                vtid: ctx("vtid"),
                vpid: ctx("vpid"),
                ts: self.ts(),
            }),
            _ => None,
        }
    }
}
