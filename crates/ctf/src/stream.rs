//! Packets and streams: reads one stream (possibly spread over rotated
//! files) packet by packet and yields its events in order.
//!
//! Memory is one packet per stream: a packet is read whole (CTF packets are
//! bounded by the tracer's sub-buffer size), its events are decoded lazily
//! and share it through an `Arc`. The buffer is reused when no event of the
//! previous packet is still alive.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use deepspan_model::{Fields, Tid, Value};

use crate::decode::{Cursor, DecodeError, Walker};
use crate::error::{Error, Result};
use crate::event::CtfEvent;
use crate::layout::{self, Scope};
use crate::metadata::{StreamClass, TraceMeta};

const CTF_MAGIC: u64 = 0xC1FC_1FC1;
/// First read of a packet: enough for any real header and context.
const PREFIX: u64 = 4096;

/// Where stream bytes come from.
#[derive(Clone)]
pub(crate) enum Source {
    File(PathBuf),
    Memory { name: PathBuf, data: Arc<[u8]> },
}

impl Source {
    pub fn path(&self) -> &Path {
        match self {
            Source::File(p) => p,
            Source::Memory { name, .. } => name,
        }
    }
}

/// An open source with a sequential read position.
enum Reader {
    File(File),
    Memory(Arc<[u8]>, usize),
}

impl Reader {
    fn open(src: &Source) -> Result<(Reader, u64)> {
        match src {
            Source::File(p) => {
                let f = File::open(p).map_err(|e| Error::io(p, e))?;
                let len = f.metadata().map_err(|e| Error::io(p, e))?.len();
                Ok((Reader::File(f), len))
            }
            Source::Memory { data, .. } => Ok((Reader::Memory(data.clone(), 0), data.len() as u64)),
        }
    }

    /// Appends exactly `n` bytes to `buf`.
    fn read_into(&mut self, buf: &mut Vec<u8>, n: usize, path: &Path) -> Result<()> {
        match self {
            Reader::File(f) => {
                // read_to_end fills spare capacity without zeroing it first.
                buf.reserve(n);
                let got = f
                    .take(n as u64)
                    .read_to_end(buf)
                    .map_err(|e| Error::io(path, e))?;
                if got < n {
                    let e = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "file shorter than expected",
                    );
                    return Err(Error::io(path, e));
                }
                Ok(())
            }
            Reader::Memory(data, pos) => {
                let end = pos.checked_add(n).filter(|e| *e <= data.len());
                let Some(end) = end else {
                    return Err(Error::data(
                        path,
                        *pos as u64,
                        "read past the end of the data",
                    ));
                };
                buf.extend_from_slice(&data[*pos..end]);
                *pos = end;
                Ok(())
            }
        }
    }
}

/// What the start of a packet says about it.
pub(crate) struct Preamble {
    pub stream: Arc<StreamClass>,
    pub instance: Option<u64>,
    /// Bit offset of the first event.
    pub events_at: u64,
    pub packet_bits: Option<u64>,
    pub content_bits: Option<u64>,
    pub ts_begin: Option<u64>,
    pub ts_end: Option<u64>,
    /// (counter, counter width in bits)
    pub discarded: Option<(u64, u8)>,
    pub cpu: Option<u32>,
    pub context: Fields,
}

fn field<'f>(fields: &'f Fields, name: &str) -> Option<&'f Value> {
    fields.iter().find(|(n, _)| &**n == name).map(|(_, v)| v)
}

fn uint(fields: &Fields, name: &str) -> Option<u64> {
    match field(fields, name)? {
        Value::UInt(u) => Some(*u),
        Value::Int(i) => Some(*i as u64),
        _ => None,
    }
}

/// Decodes the packet header and context at the start of `data`, leaving
/// their slots in `walker` (later scopes may refer to them).
pub(crate) fn preamble(
    meta: &TraceMeta,
    data: &[u8],
    walker: &mut Walker,
) -> Result<Preamble, DecodeError> {
    let mut cur = Cursor::new(data, 0, data.len() as u64 * 8);
    let fail = |bit, message: String| DecodeError {
        bit,
        message,
        short: false,
    };
    let mut header = Fields::new();
    if let Some(h) = &meta.packet_header {
        walker.reserve(layout::PACKET_HEADER, h.slots);
        walker.flatten(&h.root, layout::PACKET_HEADER, &mut cur, &mut header)?;
    }
    if let Some(magic) = uint(&header, "magic") {
        if magic != CTF_MAGIC {
            return Err(fail(
                0,
                format!("bad packet magic {magic:#x} (expected 0xc1fc1fc1)"),
            ));
        }
    }
    if let (Some(Value::Array(bytes)), Some(uuid)) = (field(&header, "uuid"), meta.uuid) {
        let got: Vec<u8> = bytes
            .iter()
            .map(|b| if let Value::UInt(b) = b { *b as u8 } else { 0 })
            .collect();
        if got != uuid {
            return Err(fail(
                32,
                "packet uuid differs from the trace uuid in the metadata".into(),
            ));
        }
    }
    let stream = match uint(&header, "stream_id") {
        Some(id) => meta
            .stream(id)
            .ok_or_else(|| fail(0, format!("packet of undeclared stream id {id}")))?,
        None if meta.streams.len() == 1 => &meta.streams[0],
        None => {
            return Err(fail(
                0,
                "packet without stream_id in a trace with several streams".into(),
            ))
        }
    };
    let mut context = Fields::new();
    let mut discarded = None;
    if let Some(c) = &stream.packet_context {
        walker.reserve(layout::PACKET_CONTEXT, c.slots);
        walker.flatten(&c.root, layout::PACKET_CONTEXT, &mut cur, &mut context)?;
        if let (Some(v), Some((_, node))) = (
            uint(&context, "events_discarded"),
            c.int_slot("events_discarded"),
        ) {
            discarded = Some((v, node.size));
        }
    }
    Ok(Preamble {
        stream: stream.clone(),
        instance: uint(&header, "stream_instance_id"),
        events_at: cur.pos,
        packet_bits: uint(&context, "packet_size"),
        content_bits: uint(&context, "content_size"),
        ts_begin: uint(&context, "timestamp_begin"),
        ts_end: uint(&context, "timestamp_end"),
        discarded,
        cpu: uint(&context, "cpu_id").map(|c| c as u32),
        context,
    })
}

/// Reads the first packet preamble of a file (to group rotated files).
pub(crate) fn first_preamble(meta: &TraceMeta, src: &Source) -> Result<Option<Preamble>> {
    let (mut reader, len) = Reader::open(src)?;
    if len == 0 {
        return Ok(None);
    }
    let mut buf = Vec::new();
    let p = read_preamble(
        meta,
        &mut reader,
        len,
        &mut buf,
        &mut Walker::new(),
        src.path(),
        0,
    )?;
    Ok(Some(p))
}

/// Reads bytes until the preamble decodes, growing the read when the
/// header turns out to be longer than the first read.
fn read_preamble(
    meta: &TraceMeta,
    reader: &mut Reader,
    remaining: u64,
    buf: &mut Vec<u8>,
    walker: &mut Walker,
    path: &Path,
    offset: u64,
) -> Result<Preamble> {
    let mut want = remaining.min(PREFIX);
    buf.clear();
    loop {
        let more = (want - buf.len() as u64) as usize;
        reader.read_into(buf, more, path)?;
        match preamble(meta, buf, walker) {
            Ok(p) => return Ok(p),
            Err(e) if e.short && want < remaining => want = remaining.min(want.saturating_mul(16)),
            Err(e) => {
                let message = if e.short {
                    format!("truncated packet header/context: {}", e.message)
                } else {
                    e.message
                };
                return Err(Error::data(path, offset + e.bit / 8, message));
            }
        }
    }
}

/// One decoded packet, shared by its events.
pub(crate) struct Packet {
    pub data: Vec<u8>,
    pub path: Arc<Path>,
    /// Offset of the packet in its file.
    pub offset: u64,
    pub stream: Arc<StreamClass>,
    pub trace: Arc<TraceShared>,
    pub instance: Option<u64>,
    pub header_slots: Vec<u64>,
    pub context_slots: Vec<u64>,
    pub context: Fields,
    pub content_bits: u64,
    pub cpu: Option<u32>,
}

/// A trace as the stream readers need it.
pub(crate) struct TraceShared {
    pub index: usize,
    pub dir: PathBuf,
    pub meta: TraceMeta,
    /// Per clock: nanoseconds from the Unix epoch to the clock's zero.
    pub offsets_ns: Vec<i128>,
    /// Thread ids are inferred from sched_switch (no tid context).
    pub tid_inferred: bool,
}

/// Events discarded by the tracer between two packets of a stream, from the
/// difference of their `events_discarded` counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostEvents {
    /// Index of the trace in [`crate::CtfTrace::traces`].
    pub trace: usize,
    pub stream_id: u64,
    pub stream_instance: Option<u64>,
    pub count: u64,
    /// Absolute ns (Unix epoch) bounds: end of the previous packet (or start
    /// of this one) and end of the packet that reports the loss.
    pub begin_ns: u64,
    pub end_ns: u64,
    /// The file of the packet that reports the loss.
    pub path: PathBuf,
}

#[derive(Default)]
pub(crate) struct LostLog {
    pub total: u64,
    pub records: Vec<LostEvents>,
}

/// The files of one stream, in reading order.
#[derive(Clone)]
pub(crate) struct StreamSpec {
    pub trace: Arc<TraceShared>,
    pub files: Vec<Source>,
}

/// Iterator over the events of one stream.
pub(crate) struct StreamEvents {
    spec: StreamSpec,
    next_file: usize,
    reader: Option<(Reader, u64, u64, Arc<Path>)>, // reader, file length, position, path
    packet: Option<Arc<Packet>>,
    pos: u64,
    walker: Walker,
    prev_discarded: Option<u64>,
    prev_end_ns: Option<u64>,
    lost: Arc<Mutex<LostLog>>,
    done: bool,
}

impl StreamEvents {
    pub fn new(spec: StreamSpec, lost: Arc<Mutex<LostLog>>) -> StreamEvents {
        StreamEvents {
            spec,
            next_file: 0,
            reader: None,
            packet: None,
            pos: 0,
            walker: Walker::new(),
            prev_discarded: None,
            prev_end_ns: None,
            lost,
            done: false,
        }
    }

    #[inline]
    fn abs_ns(&self, stream: &StreamClass, ticks: u64) -> u64 {
        let t = &self.spec.trace;
        let offset = t.offsets_ns.get(stream.clock).copied().unwrap_or(0);
        match t.meta.clocks.get(stream.clock) {
            // The common case (1 GHz clock, offset within u64): no i128.
            Some(c) if c.freq == 1_000_000_000 && (0..=u64::MAX as i128).contains(&offset) => {
                (offset as u64).saturating_add(ticks)
            }
            Some(c) => (offset + c.ticks_to_ns(ticks) as i128).clamp(0, u64::MAX as i128) as u64,
            None => (offset + ticks as i128).clamp(0, u64::MAX as i128) as u64,
        }
    }

    /// Loads the next packet; false at the end of the stream.
    fn load_packet(&mut self) -> Result<bool> {
        loop {
            if self.reader.is_none() {
                let Some(src) = self.spec.files.get(self.next_file) else {
                    return Ok(false);
                };
                self.next_file += 1;
                let (r, len) = Reader::open(src)?;
                self.reader = Some((r, len, 0, Arc::from(src.path())));
            }
            let Some((reader, len, pos, path)) = self.reader.as_mut() else {
                continue;
            };
            if *pos >= *len {
                self.reader = None;
                continue;
            }
            let (len, offset, path) = (*len, *pos, path.clone());
            let remaining = len - offset;
            // Reuse the previous packet's buffer when no event holds it.
            let mut data = match self.packet.take().map(Arc::try_unwrap) {
                Some(Ok(p)) => p.data,
                _ => Vec::new(),
            };
            let meta = &self.spec.trace.meta;
            let pre = read_preamble(
                meta,
                reader,
                remaining,
                &mut data,
                &mut self.walker,
                &path,
                offset,
            )?;
            let bad = |at: u64, m: String| Error::data(&path, offset + at, m);
            let packet_bits = pre.packet_bits.unwrap_or(remaining * 8);
            if packet_bits % 8 != 0 || packet_bits == 0 {
                return Err(bad(
                    0,
                    format!(
                        "packet size of {packet_bits} bits is not a positive whole number of bytes"
                    ),
                ));
            }
            let packet_bytes = packet_bits / 8;
            if packet_bytes > remaining {
                return Err(bad(
                    0,
                    format!("truncated packet: it declares {packet_bytes} bytes but only {remaining} remain in the file"),
                ));
            }
            let content_bits = pre.content_bits.unwrap_or(packet_bits);
            if content_bits > packet_bits || content_bits < pre.events_at {
                return Err(bad(
                    0,
                    format!(
                        "packet content size of {content_bits} bits is outside [{} (end of packet context), {packet_bits} (packet size)]",
                        pre.events_at
                    ),
                ));
            }
            if (data.len() as u64) > packet_bytes {
                // The first read went past this packet: rewind the reader.
                data.truncate(packet_bytes as usize);
                rewind(reader, &path, offset + packet_bytes)?;
            } else {
                let more = (packet_bytes - data.len() as u64) as usize;
                reader.read_into(&mut data, more, &path)?;
            }
            if let Some((_, _, pos, _)) = self.reader.as_mut() {
                *pos = offset + packet_bytes;
            }
            let stream = pre.stream.clone();
            if let Some(ts) = pre.ts_begin {
                // Already applied by decoding (clock-mapped), kept explicit
                // for producers that do not map timestamp_begin.
                if !stream
                    .packet_context
                    .as_ref()
                    .is_some_and(clock_mapped_begin)
                {
                    self.walker.clock = ts;
                }
            }
            self.account_lost(&pre, &stream, &path);
            self.pos = pre.events_at;
            self.packet = Some(Arc::new(Packet {
                data,
                path,
                offset,
                stream,
                trace: self.spec.trace.clone(),
                instance: pre.instance,
                header_slots: self.walker.slots[layout::PACKET_HEADER as usize].clone(),
                context_slots: self.walker.slots[layout::PACKET_CONTEXT as usize].clone(),
                context: pre.context,
                content_bits,
                cpu: pre.cpu,
            }));
            return Ok(true);
        }
    }

    fn account_lost(&mut self, pre: &Preamble, stream: &StreamClass, path: &Arc<Path>) {
        let end_ns = pre.ts_end.map(|t| self.abs_ns(stream, t));
        if let Some((counter, width)) = pre.discarded {
            let mask = if width >= 64 {
                u64::MAX
            } else {
                (1u64 << width) - 1
            };
            let count = counter.wrapping_sub(self.prev_discarded.unwrap_or(0)) & mask;
            self.prev_discarded = Some(counter);
            if count > 0 {
                let begin = self
                    .prev_end_ns
                    .or(pre.ts_begin.map(|t| self.abs_ns(stream, t)))
                    .unwrap_or(0);
                if let Ok(mut log) = self.lost.lock() {
                    log.total = log.total.saturating_add(count);
                    log.records.push(LostEvents {
                        trace: self.spec.trace.index,
                        stream_id: stream.id,
                        stream_instance: pre.instance,
                        count,
                        begin_ns: begin,
                        end_ns: end_ns.unwrap_or(begin),
                        path: path.to_path_buf(),
                    });
                }
            }
        }
        self.prev_end_ns = end_ns.or(self.prev_end_ns);
    }

    fn next_event(&mut self) -> Result<Option<CtfEvent>> {
        loop {
            let packet = match &self.packet {
                Some(p) if self.pos < p.content_bits => p,
                _ => {
                    if !self.load_packet()? {
                        return Ok(None);
                    }
                    continue;
                }
            };
            let start = self.pos;
            let stream = &packet.stream;
            let w = &mut self.walker;
            let mut cur = Cursor::new(&packet.data, start, packet.content_bits);
            let at =
                |e: DecodeError| Error::data(&packet.path, packet.offset + e.bit / 8, e.message);
            w.event_id = None;
            walk_scope(
                w,
                stream.event_header.as_ref(),
                layout::EVENT_HEADER,
                &mut cur,
            )
            .map_err(at)?;
            walk_scope(
                w,
                stream.event_context.as_ref(),
                layout::STREAM_EVENT_CONTEXT,
                &mut cur,
            )
            .map_err(at)?;
            let class = match w.event_id {
                Some(id) => stream.event(id).ok_or_else(|| {
                    Error::data(
                        &packet.path,
                        packet.offset + start / 8,
                        format!("unknown event id {id} in stream {}", stream.id),
                    )
                })?,
                None => stream.single.as_ref().ok_or_else(|| {
                    Error::data(
                        &packet.path,
                        packet.offset + start / 8,
                        "event header without id in a stream with several event classes",
                    )
                })?,
            };
            walk_scope(w, class.context.as_ref(), layout::EVENT_CONTEXT, &mut cur).map_err(at)?;
            let payload_at = cur.pos;
            walk_scope(w, class.payload.as_ref(), layout::PAYLOAD, &mut cur).map_err(at)?;
            if cur.pos == start {
                return Err(Error::data(
                    &packet.path,
                    packet.offset + start / 8,
                    "event of zero length (forbidden by CTF)",
                ));
            }
            self.pos = cur.pos;
            let ticks = w.clock;
            let slot = |scope, s: Option<u32>| s.map(|s| w.slot(scope, s));
            let cpu = slot(layout::PAYLOAD, class.perf_cpu)
                .map(|c| c as u32)
                .or(packet.cpu)
                .unwrap_or(0);
            let tid = slot(layout::STREAM_EVENT_CONTEXT, stream.ctx_tid)
                .or(slot(layout::STREAM_EVENT_CONTEXT, stream.ctx_vtid))
                .or(slot(layout::PAYLOAD, class.perf_tid))
                .map(|t| t as Tid);
            let switch = match (
                slot(layout::PAYLOAD, class.prev_tid),
                slot(layout::PAYLOAD, class.next_tid),
            ) {
                (Some(p), Some(n)) => Some((p as Tid, n as Tid)),
                _ => None,
            };
            let ts = self.abs_ns(stream, ticks);
            let class = class.clone();
            let packet = packet.clone();
            return Ok(Some(CtfEvent::new(
                ts, ticks, cpu, tid, switch, class, packet, start, payload_at,
            )));
        }
    }
}

fn clock_mapped_begin(c: &Scope) -> bool {
    c.int_slot("timestamp_begin").is_some_and(|(_, i)| i.clock)
}

fn rewind(reader: &mut Reader, path: &Path, to: u64) -> Result<()> {
    match reader {
        Reader::File(f) => f
            .seek(SeekFrom::Start(to))
            .map(|_| ())
            .map_err(|e| Error::io(path, e)),
        Reader::Memory(_, pos) => {
            *pos = to as usize;
            Ok(())
        }
    }
}

#[inline]
fn walk_scope(
    w: &mut Walker,
    scope: Option<&Scope>,
    id: u8,
    cur: &mut Cursor,
) -> Result<(), DecodeError> {
    if let Some(s) = scope {
        w.reserve(id, s.slots);
        w.run(&s.ops, id, cur)?;
    }
    Ok(())
}

impl Iterator for StreamEvents {
    type Item = Result<CtfEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_event() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Sums the lost-event counts of one stream by reading only packet
/// preambles.
pub(crate) fn scan_lost(spec: &StreamSpec) -> Result<u64> {
    let meta = &spec.trace.meta;
    let mut walker = Walker::new();
    let mut prev: Option<u64> = None;
    let mut total = 0u64;
    let mut buf = Vec::new();
    for src in &spec.files {
        let (mut reader, len) = Reader::open(src)?;
        let mut pos = 0;
        while pos < len {
            let pre = read_preamble(
                meta,
                &mut reader,
                len - pos,
                &mut buf,
                &mut walker,
                src.path(),
                pos,
            )?;
            let packet_bytes = pre.packet_bits.unwrap_or((len - pos) * 8) / 8;
            if packet_bytes == 0 || packet_bytes > len - pos {
                return Err(Error::data(
                    src.path(),
                    pos,
                    format!("bad packet size of {packet_bytes} bytes"),
                ));
            }
            if let Some((counter, width)) = pre.discarded {
                let mask = if width >= 64 {
                    u64::MAX
                } else {
                    (1u64 << width) - 1
                };
                total = total.saturating_add(counter.wrapping_sub(prev.unwrap_or(0)) & mask);
                prev = Some(counter);
            }
            pos += packet_bytes;
            rewind(&mut reader, src.path(), pos)?;
        }
    }
    Ok(total)
}
