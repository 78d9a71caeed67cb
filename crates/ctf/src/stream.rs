//! Packets and streams: reads one stream (possibly spread over rotated
//! files) packet by packet and yields its events in order.
//!
//! Memory stays bounded whatever the trace size: a packet is read in
//! windows (a few MiB mapped from the file, or 256 KiB read, or more for an
//! event larger than that), and events hold only the window they come from.
//! Decoding runs in batches ([`StreamEvents::fill`]) over a fast path for
//! the common layouts ([`crate::fast`]) into a chunk of small records; an
//! event is a handle on its record, and the chunk is reference counted
//! without an atomic operation per event ([`crate::share`]). Anything the
//! fast path does not cover is decoded step by step, which also reports
//! errors exactly. Buffers and record arrays are reused once no event
//! holds them any more.

use std::cell::UnsafeCell;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use deepspan_model::{Fields, Tid, Value};

use crate::decode::{Cursor, DecodeError, Walker};
use crate::error::{Error, Result};
use crate::event::{CtfEvent, Record};
use crate::fast::{Cx, HeaderFast};
use crate::layout::{self, Scope};
use crate::metadata::{EventClass, StreamClass, TraceMeta};
use crate::share::Owner;

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

    /// Size in bytes (0 when the file cannot be examined; reading it will
    /// then say why).
    pub fn len(&self) -> u64 {
        match self {
            Source::File(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
            Source::Memory { data, .. } => data.len() as u64,
        }
    }
}

/// An open source with a sequential read position.
enum Reader {
    /// The file, its length when opened, and the read position.
    File(File, u64, u64),
    Memory(Arc<[u8]>, usize),
}

impl Reader {
    fn open(src: &Source) -> Result<(Reader, u64)> {
        match src {
            Source::File(p) => {
                let f = File::open(p).map_err(|e| Error::io(p, e))?;
                let len = f.metadata().map_err(|e| Error::io(p, e))?.len();
                Ok((Reader::File(f, len, 0), len))
            }
            Source::Memory { data, .. } => Ok((Reader::Memory(data.clone(), 0), data.len() as u64)),
        }
    }

    fn pos(&self) -> u64 {
        match self {
            Reader::File(_, _, pos) => *pos,
            Reader::Memory(_, pos) => *pos as u64,
        }
    }

    /// `len` bytes at `offset` without copying them, when the source
    /// allows (see [`Bytes::Map`]); the read position does not move.
    fn map(&self, offset: u64, len: u64, opts: &ReadOptions) -> Option<Bytes> {
        match self {
            Reader::File(f, file_len, _) if opts.map && offset.checked_add(len)? <= *file_len => {
                map_file(f, offset, len)
            }
            _ => None,
        }
    }

    /// Appends exactly `n` bytes to `buf`.
    fn read_into(&mut self, buf: &mut Vec<u8>, n: usize, path: &Path) -> Result<()> {
        match self {
            Reader::File(f, _, pos) => {
                // read_to_end fills spare capacity without zeroing it first.
                buf.reserve(n);
                let got = f
                    .take(n as u64)
                    .read_to_end(buf)
                    .map_err(|e| Error::io(path, e))?;
                *pos += got as u64;
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
/// `Ok(None)` for an empty file; `Err(Cut)` inside the result when the file
/// ends inside that first preamble.
pub(crate) fn first_preamble(
    meta: &TraceMeta,
    src: &Source,
) -> Result<Result<Option<Preamble>, u64>> {
    let (mut reader, len) = Reader::open(src)?;
    if len == 0 {
        return Ok(Ok(None));
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
    Ok(p.map(Some).ok_or(len))
}

/// Reads bytes until the preamble decodes, growing the read when the
/// header turns out to be longer than the first read. `Ok(None)` when the
/// file ends inside the packet header or context (a file cut short).
fn read_preamble(
    meta: &TraceMeta,
    reader: &mut Reader,
    remaining: u64,
    buf: &mut Vec<u8>,
    walker: &mut Walker,
    path: &Path,
    offset: u64,
) -> Result<Option<Preamble>> {
    let mut want = remaining.min(PREFIX);
    buf.clear();
    loop {
        let more = (want - buf.len() as u64) as usize;
        reader.read_into(buf, more, path)?;
        match preamble(meta, buf, walker) {
            Ok(p) => return Ok(Some(p)),
            Err(e) if e.short && want < remaining => want = remaining.min(want.saturating_mul(16)),
            Err(e) if e.short => return Ok(None),
            Err(e) => return Err(Error::data(path, offset + e.bit / 8, e.message)),
        }
    }
}

/// What the events of a packet share besides its bytes.
pub(crate) struct PacketInfo {
    pub path: Arc<Path>,
    /// Offset of the packet in its file.
    pub offset: u64,
    pub stream: Arc<StreamClass>,
    pub trace: Arc<TraceShared>,
    pub instance: Option<u64>,
    pub header_slots: Vec<u64>,
    pub context_slots: Vec<u64>,
    pub context: Fields,
    pub cpu: Option<u32>,
}

/// A window of a packet's bytes, shared by the events decoded from it.
///
/// Bit positions of events are counted from `data[0]`: the window starts
/// at a multiple of the trace's largest alignment, so alignment computed
/// from there is the same as from the packet start.
pub(crate) struct Packet {
    pub data: Bytes,
    /// Where `data` goes back when the window is dropped.
    pub pool: Arc<Pool>,
    /// Byte offset of `data[0]` in the packet.
    pub base: u64,
    /// End of the packet's events in this window, in bits from `data[0]`
    /// (at most `data.len() * 8`).
    pub content_bits: u64,
    pub info: Arc<PacketInfo>,
}

/// Records per chunk (56 KiB): few enough that the chunks a stream has in
/// use (about two when events are dropped as they come) take few fresh
/// pages (at 4096, records were a fifth of the pages the decoding of a
/// small trace touched first), and enough that taking a chunk is rare.
pub(crate) const CHUNK: usize = 1024;
/// Events decoded per call of [`StreamEvents::fill`].
const BATCH: usize = 256;

/// The records of (up to [`CHUNK`]) events of one window, shared by those
/// events: the unit of reference counting (see [`crate::share`]).
pub(crate) struct Chunk {
    pub window: Arc<Packet>,
    records: Box<[RecordCell]>,
    /// Where `records` goes back when the chunk is dropped.
    pool: Arc<RecordPool>,
}

/// One record, written once (before any event refers to it), then read.
pub(crate) struct RecordCell(UnsafeCell<MaybeUninit<Record>>);

// SAFETY: a record is written once, by the stream reader, before the event
// made of it exists; afterwards it is accessed through that event only (see
// `Record`).
unsafe impl Sync for RecordCell {}

impl Chunk {
    /// # Safety
    /// Record `i` must be initialized.
    #[inline(always)]
    pub unsafe fn record(&self, i: u32) -> &Record {
        (*self.records.get_unchecked(i as usize).0.get()).assume_init_ref()
    }

    /// # Safety
    /// Record `i` (below [`CHUNK`]) must not be initialized, nor referred
    /// to.
    #[inline(always)]
    unsafe fn init(&self, i: u32, r: Record) {
        debug_assert!((i as usize) < self.records.len());
        (*self.records.get_unchecked(i as usize).0.get()).write(r);
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // Records own nothing once their events are gone (see `CtfEvent`'s
        // drop): no record needs dropping.
        self.pool.give(std::mem::take(&mut self.records));
    }
}

/// Spare record arrays of a stream (see [`Pool`]).
#[derive(Default)]
pub(crate) struct RecordPool(Mutex<Vec<Box<[RecordCell]>>>);

impl RecordPool {
    fn take(&self) -> Box<[RecordCell]> {
        self.0
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_else(|| {
                (0..CHUNK)
                    .map(|_| RecordCell(UnsafeCell::new(MaybeUninit::uninit())))
                    .collect()
            })
    }

    fn give(&self, v: Box<[RecordCell]>) {
        if v.len() != CHUNK {
            return;
        }
        if let Ok(mut p) = self.0.lock() {
            if p.len() < Pool::KEEP {
                p.push(v);
            }
        }
    }
}

/// Spare window buffers of a stream: a window is usually freed when the
/// last of its events is dropped, after the reader has moved on; its
/// buffer then serves again instead of new memory (which the system would
/// have to zero and map, page by page).
#[derive(Default)]
pub(crate) struct Pool(Mutex<Vec<Vec<u8>>>);

impl Pool {
    const KEEP: usize = 4;

    fn take(&self) -> Vec<u8> {
        let mut v = self
            .0
            .lock()
            .ok()
            .and_then(|mut p| p.pop())
            .unwrap_or_default();
        v.clear();
        v
    }

    fn give(&self, v: Vec<u8>) {
        if v.capacity() == 0 {
            return;
        }
        if let Ok(mut p) = self.0.lock() {
            if p.len() < Self::KEEP {
                p.push(v);
            }
        }
    }
}

impl Drop for Packet {
    fn drop(&mut self) {
        if let Bytes::Heap(v) = &mut self.data {
            self.pool.give(std::mem::take(v));
        }
    }
}

/// The bytes of a window: read into memory, or mapped from the file.
pub(crate) enum Bytes {
    Heap(Vec<u8>),
    /// Mapped read-only (like babeltrace2 does): the decoder reads the
    /// page cache directly instead of a copy of it. The file must not be
    /// truncated while mapped (the process would get SIGBUS, as with
    /// babeltrace2); LTTng never truncates a trace file it writes.
    Map(Mapping),
}

pub(crate) struct Mapping {
    /// The mapping (page aligned) and its length.
    base: NonNull<std::ffi::c_void>,
    map_len: usize,
    /// Where the window starts in it, and its length.
    delta: usize,
    len: usize,
}

// SAFETY: a read-only private mapping, like an immutable byte slice.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_file` with this address and length.
        #[cfg(unix)]
        unsafe {
            libc::munmap(self.base.as_ptr(), self.map_len)
        };
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    #[inline(always)]
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Heap(v) => v,
            // SAFETY: [delta, delta + len) lies in the mapping, which lives
            // as long as `self`.
            Bytes::Map(m) => unsafe {
                std::slice::from_raw_parts(m.base.as_ptr().cast::<u8>().add(m.delta), m.len)
            },
        }
    }
}

/// Maps `len` bytes of `f` at `offset` (within the file), populating the
/// page tables at once; None when mapping is not possible.
#[cfg(unix)]
fn map_file(f: &File, offset: u64, len: u64) -> Option<Bytes> {
    use std::os::unix::io::AsRawFd;
    if len == 0 {
        return None;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let populate = libc::MAP_POPULATE;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let populate = 0;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).ok().filter(|p| p.is_power_of_two())?;
    let start = offset & !(page - 1);
    let delta = (offset - start) as usize;
    let len = usize::try_from(len).ok()?;
    let map_len = len.checked_add(delta)?;
    let at = libc::off_t::try_from(start).ok()?;
    // SAFETY: a fresh read-only private mapping of a file we hold open;
    // nothing else refers to that address range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | populate,
            f.as_raw_fd(),
            at,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    Some(Bytes::Map(Mapping {
        base: NonNull::new(p)?,
        map_len,
        delta,
        len,
    }))
}

#[cfg(not(unix))]
fn map_file(_: &File, _: u64, _: u64) -> Option<Bytes> {
    None
}

/// Bytes ahead of the decoding position that the fast path asks the CPU
/// to fetch.
const PREFETCH_AHEAD: usize = 4096;

#[inline(always)]
fn prefetch(data: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < data.len() {
        // SAFETY: a hint on an address inside `data`; it cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                data.as_ptr().add(at).cast::<i8>(),
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, at);
}

impl Packet {
    /// File offset of `data[0]`.
    pub fn offset(&self) -> u64 {
        self.info.offset + self.base
    }
}

/// A trace as the stream readers need it.
pub(crate) struct TraceShared {
    pub index: usize,
    /// [`crate::CtfEvent::class_index`] of the trace's first event class.
    pub class_base: usize,
    pub dir: PathBuf,
    pub meta: TraceMeta,
    /// Per clock: nanoseconds from the Unix epoch to the clock's zero.
    pub offsets_ns: Vec<i128>,
    /// Thread ids are inferred from sched_switch (no tid context).
    pub tid_inferred: bool,
    /// Stream files found cut short, so far (at open, and by any reader).
    pub cuts: Mutex<Vec<StreamCut>>,
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

/// A stream file cut short (a copy interrupted): it ends inside a packet,
/// or its LTTng index (`index/<file>.idx`) lists packets past its end. The
/// whole packets before the cut are decoded; this says what is lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamCut {
    /// Index of the trace in [`crate::CtfTrace::traces`].
    pub trace: usize,
    pub path: PathBuf,
    /// Where the first packet not decoded (whole or in part) starts.
    pub packet_offset: u64,
    /// Bytes the file has.
    pub file_bytes: u64,
    /// Bytes the file should have: the end of the last packet its index
    /// lists, else of the packet it ends in; `None` when the file ends
    /// inside a packet header that gives no size and there is no index.
    pub expected_bytes: Option<u64>,
    /// Packets lost in part or whole, when the index tells.
    pub lost_packets: Option<u64>,
    /// Absolute ns (Unix epoch): `timestamp_begin` of the first lost packet
    /// and `timestamp_end` of the last, when known: the time range whose
    /// events of this stream are lost.
    pub begin_ns: Option<u64>,
    pub end_ns: Option<u64>,
    /// False when the cut packet's events are all decoded (only its
    /// padding is cut) and no index lists packets after it.
    pub events_lost: bool,
}

impl StreamCut {
    /// Bytes missing from the end of the file, when known.
    pub fn missing_bytes(&self) -> Option<u64> {
        self.expected_bytes
            .map(|e| e.saturating_sub(self.file_bytes))
    }
}

/// Nanoseconds as seconds with all nine decimals.
fn seconds(ns: u64) -> String {
    format!("{}.{:09} s", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl std::fmt::Display for StreamCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is cut short at byte {}",
            self.path.display(),
            self.file_bytes
        )?;
        match (self.expected_bytes, self.missing_bytes()) {
            (Some(expected), Some(missing)) => {
                write!(f, ": {missing} of {expected} bytes are missing")?
            }
            _ => write!(
                f,
                ": the header of the packet at byte {} is cut, its size is unknown",
                self.packet_offset
            )?,
        }
        if !self.events_lost {
            return write!(
                f,
                "; only the last packet's padding is cut, its events are whole"
            );
        }
        let packets = match self.lost_packets {
            Some(1) => format!("1 packet from byte {}", self.packet_offset),
            Some(n) => format!("{n} packets from byte {}", self.packet_offset),
            None => format!("the packet at byte {}", self.packet_offset),
        };
        match (self.begin_ns, self.end_ns) {
            (Some(b), Some(e)) => write!(
                f,
                "; its events from {} to {} are lost ({packets})",
                seconds(b),
                seconds(e)
            ),
            (Some(b), None) => write!(
                f,
                "; its events from {} on are lost ({packets})",
                seconds(b)
            ),
            _ => write!(f, "; the events of {packets} are lost"),
        }
    }
}

/// The packets an LTTng index lists past the end of its stream file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct IndexTail {
    pub first_offset: u64,
    /// End of the last packet listed.
    pub end: u64,
    pub packets: u64,
    /// Raw clock values of the first packet's begin and the last one's end.
    pub begin_ticks: u64,
    pub end_ticks: u64,
    pub stream_id: u64,
}

const INDEX_MAGIC: u32 = 0xC1F1_DCC1;
/// Index entries are 56 bytes (index 1.0) or 72 (1.1); larger ones are
/// taken as later versions with more fields at the end, up to this.
const MAX_INDEX_ENTRY: usize = 4096;

/// Reads `index/<name>.idx` beside the stream file `path` (LTTng writes one
/// per stream file) and returns what it lists at or past `file_bytes`.
/// `None` without an index, or with one that cannot be read: the index
/// only adds detail to a warning, so it is not an error.
pub(crate) fn index_tail(path: &Path, file_bytes: u64) -> Option<IndexTail> {
    let name = path.file_name()?.to_str()?;
    let idx = path.parent()?.join("index").join(format!("{name}.idx"));
    let mut f = std::io::BufReader::new(File::open(idx).ok()?);
    let mut head = [0u8; 16];
    f.read_exact(&mut head).ok()?;
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
    if be32(&head[0..4]) != INDEX_MAGIC {
        return None;
    }
    let len = be32(&head[12..16]) as usize;
    if !(56..=MAX_INDEX_ENTRY).contains(&len) {
        return None;
    }
    let mut entry = vec![0u8; len];
    let mut tail: Option<IndexTail> = None;
    while f.read_exact(&mut entry).is_ok() {
        let offset = be64(&entry[0..]);
        let end = offset.saturating_add(be64(&entry[8..]) / 8);
        if end <= file_bytes {
            continue;
        }
        let (begin, finish, stream) = (be64(&entry[24..]), be64(&entry[32..]), be64(&entry[48..]));
        match &mut tail {
            None => {
                tail = Some(IndexTail {
                    first_offset: offset,
                    end,
                    packets: 1,
                    begin_ticks: begin,
                    end_ticks: finish,
                    stream_id: stream,
                })
            }
            Some(t) => {
                t.first_offset = t.first_offset.min(offset);
                t.end = t.end.max(end);
                t.packets += 1;
                t.end_ticks = t.end_ticks.max(finish);
            }
        }
    }
    tail
}

/// Records `cut` once in `cuts` (several iterations may meet the same one).
pub(crate) fn note_cut(cuts: &Mutex<Vec<StreamCut>>, cut: StreamCut) {
    if let Ok(mut cuts) = cuts.lock() {
        if !cuts
            .iter()
            .any(|c| c.path == cut.path && c.packet_offset == cut.packet_offset)
        {
            cuts.push(cut);
        }
    }
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

/// Bytes read per window of a packet: the reading buffer and the data being
/// decoded stay in the CPU caches (a larger event gets a larger window).
const WINDOW: u64 = 256 << 10;
/// Bytes mapped per window of a packet, when mapped.
const MAP_WINDOW: u64 = 4 << 20;

/// How a stream is read: window sizes, and whether files are mapped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadOptions {
    pub window: u64,
    pub map_window: u64,
    pub map: bool,
    /// Read packets whole, in one window.
    pub whole: bool,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            window: WINDOW,
            map_window: MAP_WINDOW,
            map: true,
            whole: false,
        }
    }
}

impl ReadOptions {
    fn window_bytes(&self, reader: &Reader) -> u64 {
        match reader {
            Reader::File(..) if self.map => self.map_window,
            _ => self.window,
        }
        .max(1)
    }
}

/// The packet being read by a [`StreamEvents`].
struct Current {
    info: Arc<PacketInfo>,
    /// End of the packet's events, in bits from the packet start.
    content_bits: u64,
}

/// Iterator over the events of one stream.
pub(crate) struct StreamEvents {
    spec: StreamSpec,
    next_file: usize,
    /// Reader, file length, offset of the next packet, path.
    reader: Option<(Reader, u64, u64, Arc<Path>)>,
    current: Option<Current>,
    /// The current window.
    packet: Option<Arc<Packet>>,
    /// Records of the current window's decoded events: `filled` of them
    /// so far, handed out as events up to `popped`.
    chunk: Option<Owner<Chunk>>,
    filled: u32,
    popped: u32,
    /// End of the events in the current window, in bits from its start
    /// (0 without a window).
    content_bits: u64,
    /// Largest alignment of the trace in bytes (windows start at multiples
    /// of it); 0 when too large for windows: packets are then read whole.
    window_align: u64,
    opts: ReadOptions,
    /// Nanoseconds to add to clock ticks for absolute time, when the
    /// stream's clock is the common 1 GHz one with an offset in range.
    fast_offset: Option<u64>,
    /// Position in the window, in bits (after the events decoded so far).
    pos: u64,
    pool: Arc<Pool>,
    records: Arc<RecordPool>,
    walker: Walker,
    prev_discarded: Option<u64>,
    prev_end_ns: Option<u64>,
    lost: Arc<Mutex<LostLog>>,
    done: bool,
    /// Offset of the first packet to read in the first file opened (a
    /// [`StreamPart`] may start inside a file).
    resume: u64,
    /// Where the packets to read end: (file index, offset) of the first
    /// packet not to read; `None`: the end of the stream.
    stop: Option<(usize, u64)>,
}

/// A run of whole packets of a stream, read on its own: from the packet at
/// `start` (file index, byte offset) up to the one at `stop` (or the end of
/// the stream), with what the packets before it tell about lost events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamPart {
    pub start: (usize, u64),
    pub stop: Option<(usize, u64)>,
    /// The discarded-event counter and end time (absolute ns) of the
    /// packets before `start`, as [`StreamEvents`] would have them there.
    pub prev_discarded: Option<u64>,
    pub prev_end_ns: Option<u64>,
}

/// Where a packet of a stream starts and what it says about lost events
/// (see [`packet_map`]).
#[derive(Clone, Debug)]
pub(crate) struct PacketAt {
    /// Index in the stream's files, and byte offset there.
    pub file: usize,
    pub offset: u64,
    /// Bytes of the packet in its file (less than its size when the file
    /// is cut short inside it).
    pub bytes: u64,
    /// `events_discarded` and its width in bits.
    pub discarded: Option<(u64, u8)>,
    /// `timestamp_end`, absolute ns.
    pub end_ns: Option<u64>,
    /// The packet sets the stream clock (`timestamp_begin`): its events'
    /// timestamps do not depend on the packets before it.
    pub sets_clock: bool,
}

impl PacketAt {
    /// (file index, offset): where a [`StreamPart`] starting here starts.
    pub fn at(&self) -> (usize, u64) {
        (self.file, self.offset)
    }
}

/// The part of a stream from packet `from` of `packets` (its
/// [`packet_map`]) to packet `to` (excluded; `None`: to the end).
pub(crate) fn part_of(packets: &[PacketAt], from: usize, to: Option<usize>) -> StreamPart {
    let (mut prev_discarded, mut prev_end_ns) = (None, None);
    for p in &packets[..from] {
        prev_discarded = p.discarded.map(|(c, _)| c).or(prev_discarded);
        prev_end_ns = p.end_ns.or(prev_end_ns);
    }
    StreamPart {
        start: packets.get(from).map_or((0, 0), PacketAt::at),
        stop: to.and_then(|t| packets.get(t)).map(PacketAt::at),
        prev_discarded,
        prev_end_ns,
    }
}

impl StreamEvents {
    pub fn new(spec: StreamSpec, lost: Arc<Mutex<LostLog>>, opts: ReadOptions) -> StreamEvents {
        let align = (spec.trace.meta.max_align as u64).div_ceil(8).max(1);
        let whole = opts.whole || align > WINDOW / 16;
        StreamEvents {
            spec,
            next_file: 0,
            reader: None,
            current: None,
            packet: None,
            content_bits: 0,
            window_align: if whole { 0 } else { align },
            opts,
            fast_offset: None,
            pos: 0,
            chunk: None,
            filled: 0,
            popped: 0,
            pool: Arc::default(),
            records: Arc::default(),
            walker: Walker::new(),
            prev_discarded: None,
            prev_end_ns: None,
            lost,
            done: false,
            resume: 0,
            stop: None,
        }
    }

    /// The trace the stream belongs to.
    pub fn trace(&self) -> &TraceShared {
        &self.spec.trace
    }

    /// The discarded-event log the reader adds to.
    pub fn lost_log(&self) -> Arc<Mutex<LostLog>> {
        self.lost.clone()
    }

    /// The events of `part` of the stream only.
    pub fn part(
        spec: StreamSpec,
        lost: Arc<Mutex<LostLog>>,
        opts: ReadOptions,
        part: &StreamPart,
    ) -> StreamEvents {
        let mut events = StreamEvents::new(spec, lost, opts);
        (events.next_file, events.resume) = part.start;
        events.stop = part.stop;
        events.prev_discarded = part.prev_discarded;
        events.prev_end_ns = part.prev_end_ns;
        events
    }

    #[inline]
    fn abs_ns(&self, stream: &StreamClass, ticks: u64) -> u64 {
        abs_ns(&self.spec.trace, stream, ticks)
    }

    /// Whether the file being read is on disk (it may have an index).
    fn current_is_file(&self) -> bool {
        matches!(
            self.next_file
                .checked_sub(1)
                .and_then(|i| self.spec.files.get(i)),
            Some(Source::File(_))
        )
    }

    /// Loads the first window of the next packet; false at the end of the
    /// stream.
    fn load_packet(&mut self) -> Result<bool> {
        // Reuse the previous window's buffer when no event holds it.
        self.content_bits = 0;
        self.end_window();
        let mut data = self.pool.take();
        loop {
            if self.reader.is_none() {
                let Some(src) = self.spec.files.get(self.next_file) else {
                    return Ok(false);
                };
                self.next_file += 1;
                let (r, len) = Reader::open(src)?;
                let at = std::mem::take(&mut self.resume);
                self.reader = Some((r, len, at, Arc::from(src.path())));
                self.current = None;
            }
            let Some((reader, len, pos, path)) = self.reader.as_mut() else {
                continue;
            };
            if *pos >= *len {
                // Read to its end: its index may still say it was cut
                // between two packets.
                let (len, path) = (*len, path.clone());
                if self.current_is_file() {
                    cut_short(&self.spec.trace, &path, len, len, None, None, true, true);
                }
                self.reader = None;
                continue;
            }
            let (len, offset, path) = (*len, *pos, path.clone());
            if self.stop == Some((self.next_file - 1, offset)) {
                return Ok(false);
            }
            self.current = None;
            if reader.pos() != offset {
                // The previous packet was not read to its end.
                rewind(reader, &path, offset)?;
            }
            let remaining = len - offset;
            let meta = &self.spec.trace.meta;
            let Some(pre) = read_preamble(
                meta,
                reader,
                remaining,
                &mut data,
                &mut self.walker,
                &path,
                offset,
            )?
            else {
                let file_backed = self.current_is_file();
                cut_short(
                    &self.spec.trace,
                    &path,
                    offset,
                    len,
                    None,
                    None,
                    true,
                    file_backed,
                );
                self.reader = None;
                continue;
            };
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
            let mut packet_bytes = packet_bits / 8;
            let content_bits = pre.content_bits.unwrap_or(packet_bits);
            if packet_bytes > remaining {
                // The file is cut short inside this packet: keep it when
                // only its padding is gone, else drop it.
                let whole_events =
                    content_bits <= packet_bits && content_bits.div_ceil(8) <= remaining;
                cut_short(
                    &self.spec.trace,
                    &path,
                    offset,
                    len,
                    Some(packet_bytes),
                    Some(&pre),
                    !whole_events,
                    matches!(
                        self.spec.files.get(self.next_file - 1),
                        Some(Source::File(_))
                    ),
                );
                if !whole_events {
                    self.reader = None;
                    continue;
                }
                packet_bytes = remaining;
            }
            if content_bits > packet_bits.min(packet_bytes * 8) || content_bits < pre.events_at {
                return Err(bad(
                    0,
                    format!(
                        "packet content size of {content_bits} bits is outside [{} (end of packet context), {packet_bits} (packet size)]",
                        pre.events_at
                    ),
                ));
            }
            // The first window: whole packet, or up to a window of its
            // content.
            let want = if self.window_align == 0 {
                packet_bytes
            } else {
                content_bits.div_ceil(8).min(self.opts.window_bytes(reader))
            };
            let bytes = if (data.len() as u64) > packet_bytes {
                // The first read went past this packet.
                data.truncate(packet_bytes as usize);
                Bytes::Heap(data)
            } else if let Some(map) = reader.map(offset, want.max(data.len() as u64), &self.opts) {
                self.pool.give(data);
                map
            } else {
                let want = want.max(data.len() as u64);
                let more = (want - data.len() as u64) as usize;
                reader.read_into(&mut data, more, &path)?;
                Bytes::Heap(data)
            };
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
            self.fast_offset = self.clock_fast_offset(&stream);
            // The fast path does not reserve slots per event.
            let w = &mut self.walker;
            let slots = |s: &Option<Scope>| s.as_ref().map_or(0, |s| s.slots);
            w.reserve(layout::EVENT_HEADER, slots(&stream.event_header));
            w.reserve(layout::STREAM_EVENT_CONTEXT, slots(&stream.event_context));
            w.reserve(layout::EVENT_CONTEXT, stream.class_slots.0);
            w.reserve(layout::PAYLOAD, stream.class_slots.1);
            let info = Arc::new(PacketInfo {
                path,
                offset,
                stream,
                trace: self.spec.trace.clone(),
                instance: pre.instance,
                header_slots: self.walker.slots[layout::PACKET_HEADER as usize].clone(),
                context_slots: self.walker.slots[layout::PACKET_CONTEXT as usize].clone(),
                context: pre.context,
                cpu: pre.cpu,
            });
            self.current = Some(Current {
                info: info.clone(),
                content_bits,
            });
            self.set_window(bytes, 0, info);
            self.pos = pre.events_at;
            return Ok(true);
        }
    }

    fn set_window(&mut self, data: Bytes, base: u64, info: Arc<PacketInfo>) {
        let content = self.current.as_ref().map_or(0, |c| c.content_bits);
        let content_bits = content.saturating_sub(base * 8).min(data.len() as u64 * 8);
        self.content_bits = content_bits;
        self.end_window();
        self.packet = Some(Arc::new(Packet {
            data,
            pool: self.pool.clone(),
            base,
            content_bits,
            info,
        }));
    }

    /// Leaves the current window (all its events handed out): its chunk of
    /// records and the window itself live on as long as events hold them.
    fn end_window(&mut self) {
        debug_assert!(self.popped == self.filled);
        self.chunk = None;
        self.filled = 0;
        self.popped = 0;
        self.packet = None;
    }

    /// Makes room for a record in the current chunk (a new chunk of the
    /// current window when there is none or it is full); false without a
    /// window.
    #[inline]
    fn chunk_room(&mut self) -> bool {
        if self.chunk.is_some() && (self.filled as usize) < CHUNK {
            return true;
        }
        let Some(window) = &self.packet else {
            return false;
        };
        debug_assert!(self.popped == self.filled);
        self.chunk = Some(Owner::new(Chunk {
            window: window.clone(),
            records: self.records.take(),
            pool: self.records.clone(),
        }));
        self.filled = 0;
        self.popped = 0;
        true
    }

    /// Whether the current window holds the rest of the packet's events.
    fn window_is_last(&self) -> bool {
        match (&self.current, &self.packet) {
            (Some(c), Some(w)) => (w.base + w.data.len() as u64) * 8 >= c.content_bits,
            _ => true,
        }
    }

    /// Moves the window on so that it starts at the event at `self.pos`
    /// and holds more data: at least [`WINDOW`] bytes, or twice what was
    /// left (for an event longer than the window), or up to the end of
    /// the packet's content.
    fn next_window(&mut self) -> Result<()> {
        let (Some(c), Some(old)) = (self.current.as_mut(), self.packet.take()) else {
            return Ok(());
        };
        let Some((reader, _, _, path)) = self.reader.as_mut() else {
            return Ok(());
        };
        let w = &*old;
        let at = w.base * 8 + self.pos;
        let base = at / 8 / self.window_align * self.window_align;
        let keep = ((base - w.base) as usize).min(w.data.len());
        let tail = w.data.len() - keep;
        let content_bytes = c.content_bits.div_ceil(8);
        let want = (self.opts.window_bytes(reader).max(2 * tail as u64)).min(content_bytes - base);
        let info = w.info.clone();
        let data = match reader.map(info.offset + base, want, &self.opts) {
            Some(map) => map,
            None => {
                let mut data = self.pool.take();
                data.reserve(want as usize);
                data.extend_from_slice(&w.data[keep..]);
                // The rest, from the end of the old window.
                let from = info.offset + w.base + w.data.len() as u64;
                if reader.pos() != from {
                    rewind(reader, path, from)?;
                }
                let more = (want - tail as u64) as usize;
                reader.read_into(&mut data, more, path)?;
                Bytes::Heap(data)
            }
        };
        // Back to the pool now if no event holds it, else when the last
        // one is dropped.
        drop(old);
        self.pos = at - base * 8;
        self.set_window(data, base, info);
        Ok(())
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

    /// See [`StreamEvents::fast_offset`].
    fn clock_fast_offset(&self, stream: &StreamClass) -> Option<u64> {
        let t = &self.spec.trace;
        let offset = t.offsets_ns.get(stream.clock).copied().unwrap_or(0);
        match t.meta.clocks.get(stream.clock) {
            Some(c) if c.freq == 1_000_000_000 && (0..=u64::MAX as i128).contains(&offset) => {
                Some(offset as u64)
            }
            _ => None,
        }
    }

    /// The scopes after the event header one by one, for event classes
    /// without a [`crate::layout::ClassFast`] program.
    #[inline(never)]
    fn scopes_ok(
        w: &mut Walker,
        context: Option<&Scope>,
        class: &EventClass,
        data: &[u8],
        pos: &mut u64,
        end: u64,
    ) -> Option<u64> {
        let mut ok = match context {
            Some(c) => w.plan_ok(
                &c.plan,
                &c.ops,
                layout::STREAM_EVENT_CONTEXT,
                data,
                pos,
                end,
            ),
            None => true,
        };
        ok = ok
            && match &class.context {
                Some(c) => w.plan_ok(&c.plan, &c.ops, layout::EVENT_CONTEXT, data, pos, end),
                None => true,
            };
        let payload_at = *pos;
        ok = ok
            && match &class.payload {
                Some(c) => w.plan_ok(&c.plan, &c.ops, layout::PAYLOAD, data, pos, end),
                None => true,
            };
        ok.then_some(payload_at)
    }

    /// The timestamp of the next event, decoding it if needed; None at the
    /// end of the stream. The event itself is then taken with
    /// [`StreamEvents::pop`] (a merge looks at every stream's next event
    /// but takes only the earliest).
    #[inline(always)]
    pub fn peek(&mut self) -> Option<Result<u64>> {
        if self.popped < self.filled {
            let chunk = self.chunk.as_ref()?;
            // SAFETY: records below `filled` are initialized.
            return Some(Ok(unsafe { chunk.get().record(self.popped).ts() }));
        }
        self.peek_slow()
    }

    #[inline(never)]
    fn peek_slow(&mut self) -> Option<Result<u64>> {
        if self.done {
            return None;
        }
        match self.ready() {
            Ok(true) => self.peek(),
            Ok(false) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }

    /// The next decoded event waiting in the chunk.
    #[inline(always)]
    pub fn pop(&mut self) -> Option<(CtfEvent, u64)> {
        if self.popped >= self.filled {
            return None;
        }
        let idx = self.popped;
        self.popped += 1;
        let owner = self.chunk.as_mut()?;
        // SAFETY: records below `filled` are initialized; each is popped
        // once.
        let ts = unsafe { owner.get().record(idx).ts() };
        Some((unsafe { CtfEvent::from_chunk(owner.share(), idx) }, ts))
    }

    /// Decodes up to [`BATCH`] events of the current window into its chunk
    /// of records, the fast way: a tight loop over the scopes' plans. Stops
    /// before the first event that does not decode without trouble (end of
    /// window, short data, an error), which [`StreamEvents::next_event`]
    /// then decodes the careful way. False when not one event was decoded.
    #[inline(never)]
    fn fill(&mut self) -> bool {
        if self.pos >= self.content_bits || !self.chunk_room() {
            return false;
        }
        // A handle of its own on the window, so that the header decoder
        // can be chosen once for the whole batch.
        let Some(packet) = self.packet.clone() else {
            return false;
        };
        let stream = &*packet.info.stream;
        match (&stream.event_header, &stream.header_fast) {
            (Some(_), HeaderFast::Lttng(l)) => {
                self.fill_with(&packet, |cx, _, data, pos, end| l.run(cx, data, pos, end))
            }
            (None, _) => self.fill_with(&packet, |_, _, _, _, _| true),
            (Some(h), HeaderFast::Generic) => self.fill_with(&packet, |cx, w, data, pos, end| {
                // The generic plan works on the walker itself.
                w.clock = cx.clock;
                w.event_id = None;
                std::mem::swap(&mut w.slots, cx.slots);
                let ok = w.plan_ok(&h.plan, &h.ops, layout::EVENT_HEADER, data, pos, end);
                std::mem::swap(&mut w.slots, cx.slots);
                cx.clock = w.clock;
                cx.event_id = w.event_id;
                ok
            }),
            (Some(_), hf) => {
                self.fill_with(&packet, |cx, _, data, pos, end| hf.run(cx, data, pos, end))
            }
        }
    }

    /// [`StreamEvents::fill`] with a given event header decoder.
    #[inline(always)]
    fn fill_with(
        &mut self,
        packet: &Packet,
        header: impl Fn(&mut Cx, &mut Walker, &[u8], &mut u64, u64) -> bool,
    ) -> bool {
        let Some(chunk) = self.chunk.as_ref() else {
            return false;
        };
        let chunk = chunk.get();
        let first = self.filled;
        let last = (first as usize + BATCH).min(CHUNK) as u32;
        let mut filled = first;
        let data = &packet.data[..];
        let info = &*packet.info;
        let stream = &*info.stream;
        let end = self.content_bits.min(data.len() as u64 * 8);
        let w = &mut self.walker;
        let trace = &*self.spec.trace;
        let fast_offset = self.fast_offset;
        let context = stream.event_context.as_ref();
        let packet_cpu = info.cpu.unwrap_or(0);
        let ctx_tid = stream.ctx_tid.or(stream.ctx_vtid);
        let mut pos = self.pos;
        let mut slots = std::mem::take(&mut w.slots);
        let mut clock = w.clock;
        while pos < end && filled < last {
            let start = pos;
            prefetch(data, (pos / 8) as usize + PREFETCH_AHEAD);
            prefetch(data, (pos / 8) as usize + PREFETCH_AHEAD + 64);
            // Clock and event id in registers, slots out of the walker.
            let mut cx = Cx {
                clock,
                event_id: None,
                slots: &mut slots,
            };
            let ok = header(&mut cx, w, data, &mut pos, end);
            let Some(class) = ok.then(|| stream.class_of(cx.event_id)).flatten() else {
                pos = start;
                break;
            };
            let payload_at = match &class.fast {
                Some(fast) => fast.run(&mut cx, data, &mut pos, end),
                None => {
                    w.clock = cx.clock;
                    w.event_id = cx.event_id;
                    std::mem::swap(&mut w.slots, &mut slots);
                    let p = Self::scopes_ok(w, context, class, data, &mut pos, end);
                    std::mem::swap(&mut w.slots, &mut slots);
                    cx = Cx {
                        clock: w.clock,
                        event_id: w.event_id,
                        slots: &mut slots,
                    };
                    p
                }
            };
            let Some(payload_at) = payload_at.filter(|_| pos != start) else {
                pos = start;
                break;
            };
            let ticks = cx.clock;
            clock = ticks;
            let slot =
                |scope: u8, s: u32| slots[scope as usize].get(s as usize).copied().unwrap_or(0);
            let cpu = match class.perf_cpu {
                None => packet_cpu,
                Some(s) => slot(layout::PAYLOAD, s) as u32,
            };
            let tid = match (ctx_tid, class.perf_tid) {
                (Some(s), _) => Some(slot(layout::STREAM_EVENT_CONTEXT, s) as Tid),
                (None, Some(s)) => Some(slot(layout::PAYLOAD, s) as Tid),
                (None, None) => None,
            };
            let ts = match fast_offset {
                Some(offset) => offset.saturating_add(ticks),
                None => abs_ns(trace, stream, ticks),
            };
            // SAFETY: record `filled` is not initialized yet, and no event
            // refers to it.
            unsafe {
                chunk.init(
                    filled,
                    Record::new(ts, ticks, cpu, tid, class, start, payload_at),
                )
            };
            filled += 1;
        }
        w.slots = slots;
        w.clock = clock;
        self.pos = pos;
        self.filled = filled;
        filled > first
    }

    fn next_event(&mut self) -> Result<Option<CtfEvent>> {
        if !self.ready()? {
            return Ok(None);
        }
        Ok(self.pop().map(|(e, _)| e))
    }

    /// Decodes until a record waits in the chunk: false at the end of the
    /// stream.
    fn ready(&mut self) -> Result<bool> {
        loop {
            if self.popped < self.filled {
                return Ok(true);
            }
            if self.fill() {
                continue;
            }
            if self.pos >= self.content_bits {
                if self.window_is_last() {
                    if !self.load_packet()? {
                        return Ok(false);
                    }
                } else {
                    self.next_window()?;
                }
                continue;
            }
            let clock0 = self.walker.clock;
            match self.slow_event() {
                Ok(()) => return Ok(true),
                Err(e) if e.short && !self.window_is_last() => {
                    // The event continues past the window: move it on.
                    self.walker.clock = clock0;
                    self.next_window()?;
                }
                Err(e) => {
                    let at = self.packet.as_ref().map_or(0, |p| p.offset());
                    let path = match &self.current {
                        Some(c) => c.info.path.to_path_buf(),
                        None => PathBuf::new(),
                    };
                    return Err(Error::data(&path, at + e.bit / 8, e.message));
                }
            }
        }
    }

    /// Decodes the event at `self.pos` of the window step by step, for
    /// the exact error, into the next record of the chunk; the bit offset
    /// of an error is from the window start.
    fn slow_event(&mut self) -> Result<(), DecodeError> {
        let no_packet = || DecodeError {
            bit: 0,
            message: "no packet".into(),
            short: false,
        };
        if !self.chunk_room() {
            return Err(no_packet());
        }
        let Some(packet) = self.packet.as_deref() else {
            return Err(no_packet());
        };
        let start = self.pos;
        let info = &*packet.info;
        let stream = &*info.stream;
        let w = &mut self.walker;
        let mut cur = Cursor::new(&packet.data, start, packet.content_bits);
        let fail = |message: String| DecodeError {
            bit: start,
            message,
            short: false,
        };
        w.event_id = None;
        walk_scope(
            w,
            stream.event_header.as_ref(),
            layout::EVENT_HEADER,
            &mut cur,
        )?;
        walk_scope(
            w,
            stream.event_context.as_ref(),
            layout::STREAM_EVENT_CONTEXT,
            &mut cur,
        )?;
        let index = match w.event_id {
            Some(id) => stream
                .event(id)
                .ok_or_else(|| fail(format!("unknown event id {id} in stream {}", stream.id)))?,
            None => stream.single.ok_or_else(|| {
                fail("event header without id in a stream with several event classes".into())
            })?,
        };
        let class = &stream.classes[index as usize];
        walk_scope(w, class.context.as_ref(), layout::EVENT_CONTEXT, &mut cur)?;
        let payload_at = cur.pos;
        walk_scope(w, class.payload.as_ref(), layout::PAYLOAD, &mut cur)?;
        if cur.pos == start {
            return Err(fail("event of zero length (forbidden by CTF)".into()));
        }
        let end = cur.pos;
        let ticks = w.clock;
        let slot = |scope, s: Option<u32>| s.map(|s| w.slot(scope, s));
        let cpu = slot(layout::PAYLOAD, class.perf_cpu)
            .map(|c| c as u32)
            .or(info.cpu)
            .unwrap_or(0);
        let tid = slot(layout::STREAM_EVENT_CONTEXT, stream.ctx_tid)
            .or(slot(layout::STREAM_EVENT_CONTEXT, stream.ctx_vtid))
            .or(slot(layout::PAYLOAD, class.perf_tid))
            .map(|t| t as Tid);
        let ts = abs_ns(&self.spec.trace, stream, ticks);
        self.pos = end;
        let record = Record::new(ts, ticks, cpu, tid, class, start, payload_at);
        let Some(chunk) = self.chunk.as_ref() else {
            return Err(no_packet());
        };
        // SAFETY: record `filled` is not initialized yet (chunk_room), and
        // no event refers to it.
        unsafe { chunk.get().init(self.filled, record) };
        self.filled += 1;
        Ok(())
    }
}

/// Notes that the file at `path` (of `file_bytes` bytes) of `trace` is cut
/// short: it ends inside the packet at `offset` (whose preamble is `pre`
/// when it could be read, declaring `packet_bytes`), or, without `pre` and
/// at the end of the file, its index lists packets past its end.
#[allow(clippy::too_many_arguments)]
fn cut_short(
    trace: &TraceShared,
    path: &Path,
    offset: u64,
    file_bytes: u64,
    packet_bytes: Option<u64>,
    pre: Option<&Preamble>,
    events_lost: bool,
    file_backed: bool,
) {
    // Files in memory have no index beside them.
    let index = file_backed.then(|| index_tail(path, file_bytes)).flatten();
    if pre.is_none() && offset >= file_bytes && index.is_none() {
        // Read to its end, and no index says there was more.
        return;
    }
    let time = |stream: Option<&StreamClass>, t: Option<u64>| Some(abs_ns(trace, stream?, t?));
    let stream = pre.map(|p| &*p.stream);
    let index_stream = index
        .as_ref()
        .and_then(|i| trace.meta.stream(i.stream_id).map(|s| &**s))
        .or(stream);
    let packet_end = packet_bytes.map(|p| offset.saturating_add(p));
    let cut = StreamCut {
        trace: trace.index,
        path: path.to_path_buf(),
        packet_offset: index
            .as_ref()
            .map_or(offset, |i| i.first_offset.min(offset)),
        file_bytes,
        expected_bytes: match (packet_end, index.as_ref().map(|i| i.end)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        },
        lost_packets: index.as_ref().map(|i| i.packets),
        begin_ns: time(stream, pre.and_then(|p| p.ts_begin))
            .or_else(|| time(index_stream, index.as_ref().map(|i| i.begin_ticks))),
        end_ns: time(index_stream, index.as_ref().map(|i| i.end_ticks))
            .max(time(stream, pre.and_then(|p| p.ts_end))),
        // Packets past the cut one are lost whatever its padding.
        events_lost: events_lost
            || index
                .as_ref()
                .is_some_and(|i| i.end > packet_end.unwrap_or(0)),
    };
    note_cut(&trace.cuts, cut);
}

pub(crate) fn abs_ns(t: &TraceShared, stream: &StreamClass, ticks: u64) -> u64 {
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

fn clock_mapped_begin(c: &Scope) -> bool {
    c.int_slot("timestamp_begin").is_some_and(|(_, i)| i.clock)
}

fn rewind(reader: &mut Reader, path: &Path, to: u64) -> Result<()> {
    match reader {
        Reader::File(f, _, pos) => {
            f.seek(SeekFrom::Start(to))
                .map_err(|e| Error::io(path, e))?;
            *pos = to;
            Ok(())
        }
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
        w.run_plan(&s.plan, &s.ops, id, cur)?;
    }
    Ok(())
}

impl Iterator for StreamEvents {
    type Item = Result<CtfEvent>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        // Most events wait decoded in the chunk.
        if let Some((event, _)) = self.pop() {
            return Some(Ok(event));
        }
        self.next_slow()
    }
}

impl StreamEvents {
    #[inline(never)]
    fn next_slow(&mut self) -> Option<Result<CtfEvent>> {
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
    let mut prev: Option<u64> = None;
    let mut total = 0u64;
    for (counter, width) in packet_map(spec)?.iter().filter_map(|p| p.discarded) {
        let mask = if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        total = total.saturating_add(counter.wrapping_sub(prev.unwrap_or(0)) & mask);
        prev = Some(counter);
    }
    Ok(total)
}

/// The packets of one stream whose events are read, in reading order, by
/// reading only their preambles: up to a file's end or the first packet
/// cut short (included when its events are whole, as the reader keeps
/// them).
pub(crate) fn packet_map(spec: &StreamSpec) -> Result<Vec<PacketAt>> {
    let meta = &spec.trace.meta;
    let mut walker = Walker::new();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for (file, src) in spec.files.iter().enumerate() {
        let (mut reader, len) = Reader::open(src)?;
        let mut pos = 0;
        while pos < len {
            let Some(pre) = read_preamble(
                meta,
                &mut reader,
                len - pos,
                &mut buf,
                &mut walker,
                src.path(),
                pos,
            )?
            else {
                // Cut short: the events read stop here too.
                break;
            };
            let packet_bytes = pre.packet_bits.unwrap_or((len - pos) * 8) / 8;
            if packet_bytes > len - pos {
                // A cut packet counts only when its events are kept.
                let content = pre.content_bits.unwrap_or(u64::MAX).div_ceil(8);
                if content > len - pos {
                    break;
                }
            } else if packet_bytes == 0 {
                return Err(Error::data(
                    src.path(),
                    pos,
                    format!("bad packet size of {packet_bytes} bytes"),
                ));
            }
            let bytes = packet_bytes.min(len - pos);
            out.push(PacketAt {
                file,
                offset: pos,
                bytes,
                discarded: pre.discarded,
                end_ns: pre.ts_end.map(|t| abs_ns(&spec.trace, &pre.stream, t)),
                sets_clock: pre.ts_begin.is_some(),
            });
            pos += bytes;
            rewind(&mut reader, src.path(), pos)?;
        }
    }
    Ok(out)
}
