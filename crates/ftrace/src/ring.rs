//! Ring-buffer pages: the per-CPU record iterators and their time-ordered
//! merge.
//!
//! Each CPU's data is a sequence of pages (kernel sub-buffers): a u64
//! timestamp, a `long` commit word (bytes of events, plus flags for lost
//! events), then the events. Each event starts with a u32 holding a 5-bit
//! type/length and a 27-bit time delta. The data is read in chunks of whole
//! pages (or, in compressed v7 files, one compressed chunk at a time), so
//! memory stays bounded however large the file, and each record's payload
//! is a zero-copy slice of its chunk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use deepspan_model::{Merge, Timestamped};

use crate::compress::Codec;
use crate::error::{Error, Location};
use crate::record::{Record, RecordRef};
use crate::source::{Endian, Source};
use crate::typed::IntAt;

/// How raw ring-buffer timestamps become nanoseconds, as `trace-cmd
/// report` does it: TSC2NSEC scaling (`ts * mult >> shift`) when the file
/// has it, then the fixed offset of the DATE and OFFSET options.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TsConv {
    pub(crate) tsc: Option<(u32, u32)>,
    pub(crate) offset: i64,
}

impl TsConv {
    #[inline]
    pub(crate) fn apply(self, raw: u64) -> u64 {
        let ts = match self.tsc {
            Some((mult, shift)) => ((u128::from(raw) * u128::from(mult)) >> shift) as u64,
            None => raw,
        };
        ts.wrapping_add_signed(self.offset)
    }
}

/// Where the fields of a page header are, from the trace's `header_page`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageLayout {
    pub(crate) page_size: usize,
    pub(crate) commit_off: usize,
    /// The kernel's `long`: 4 or 8.
    pub(crate) commit_size: usize,
    pub(crate) data_off: usize,
    pub(crate) endian: Endian,
}

/// Counters shared by the CPU iterators of one [`Records`].
#[derive(Debug, Default)]
struct Shared {
    lost: AtomicU64,
    bytes: AtomicU64,
}

/// Where one CPU's data is and how it is stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuSpan {
    pub(crate) cpu: u32,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    /// Set when the data is a sequence of compressed chunks (v7).
    pub(crate) codec: Option<Codec>,
}

/// Where the next chunk of pages comes from.
#[derive(Debug)]
enum Feed {
    Raw {
        next: u64,
        end: u64,
    },
    /// Compressed data starts with a u32 count of chunks, read lazily so
    /// that its errors come out of the iterator.
    CompressedStart {
        codec: Codec,
        at: u64,
    },
    Compressed {
        codec: Codec,
        next: u64,
        left: u32,
    },
    Done,
}

/// Raw data is read this many bytes (rounded to whole pages) at a time:
/// large enough that reads cost little, small enough that a many-CPU trace
/// (one chunk per CPU in flight) stays within tens of MiB.
const RAW_CHUNK: usize = 256 << 10;
/// Largest uncompressed chunk accepted (trace-cmd writes far smaller ones).
const MAX_CHUNK: u32 = 256 << 20;

pub(crate) const TYPE_PADDING: u32 = 29;
pub(crate) const TYPE_TIME_EXTEND: u32 = 30;
pub(crate) const TYPE_TIME_STAMP: u32 = 31;
pub(crate) const DELTA_MASK: u32 = (1 << 27) - 1;
pub(crate) const COMMIT_MASK: u64 = (1 << 27) - 1;
const MISSING_EVENTS: u64 = 1 << 31;
const MISSING_STORED: u64 = 1 << 30;
/// Absolute timestamps lack the top 5 bits; they come from the running time.
pub(crate) const TS_MSB: u64 = 0xf8 << 56;

/// The records of one CPU, in ring-buffer (time) order.
///
/// Yields `Err` once on broken data and then ends. Missed events reported
/// by the kernel are counted in [`CpuRecords::lost_events`].
pub struct CpuRecords {
    src: Arc<Source>,
    cpu: u32,
    layout: PageLayout,
    ts_conv: TsConv,
    common_type: IntAt,
    feed: Feed,
    raw_chunk: usize,
    /// Whole pages of data, and the file location of its first byte.
    chunk: Bytes,
    /// The chunk before `chunk`: once no record uses it any more, its
    /// memory is reused for the next chunk, so that steady-state decoding
    /// neither allocates nor zeroes memory.
    spare: Bytes,
    chunk_loc: Location,
    /// Offset in `chunk` of the next page to start.
    next_page: usize,
    /// The current page: next event header and end of committed data.
    pos: usize,
    end: usize,
    /// Raw (unconverted) time of the last event read.
    ts: u64,
    lost: u64,
    shared: Arc<Shared>,
    failed: bool,
}

impl CpuRecords {
    pub(crate) fn new(
        src: Arc<Source>,
        span: Option<CpuSpan>,
        cpu: u32,
        layout: PageLayout,
        ts_conv: TsConv,
        common_type: IntAt,
    ) -> CpuRecords {
        let feed = match span {
            None => Feed::Done,
            Some(s) if s.size == 0 => Feed::Done,
            Some(CpuSpan {
                offset,
                codec: Some(codec),
                ..
            }) => Feed::CompressedStart { codec, at: offset },
            Some(CpuSpan {
                offset,
                size,
                codec: None,
                ..
            }) => Feed::Raw {
                next: offset,
                end: offset.saturating_add(size),
            },
        };
        let page = layout.page_size.max(1);
        CpuRecords {
            src,
            cpu,
            layout,
            ts_conv,
            common_type,
            feed,
            raw_chunk: (RAW_CHUNK / page).max(1) * page,
            chunk: Bytes::new(),
            spare: Bytes::new(),
            chunk_loc: Location::File(0),
            next_page: 0,
            pos: 0,
            end: 0,
            ts: 0,
            lost: 0,
            shared: Arc::new(Shared::default()),
            failed: false,
        }
    }

    /// Events the kernel reported as lost (overwritten or dropped) so far.
    /// A page that says events were missed without saying how many counts
    /// as one.
    pub fn lost_events(&self) -> u64 {
        self.lost
    }

    /// The CPU these records are from.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    fn error(&self, chunk_offset: usize, what: impl Into<String>) -> Error {
        Error::Cpu {
            at: self.chunk_loc.add(chunk_offset as u64),
            cpu: self.cpu,
            what: what.into(),
        }
    }

    /// Reads the next event of the current page; `Ok(None)` for entries that
    /// are not records (time extends, padding).
    #[inline]
    fn next_entry(&mut self) -> Result<Option<Entry>, Error> {
        let e = self.layout.endian;
        let pos = self.pos;
        let left = self.end - pos;
        let data = &self.chunk[..];
        if left < 4 {
            // Too short for an event header: the kernel pads like this.
            self.pos = self.end;
            return Ok(None);
        }
        let word = e.u32([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]);
        let (type_len, delta) = if e.big {
            (word >> 27, word & DELTA_MASK)
        } else {
            (word & 31, word >> 5)
        };
        let array0 = || {
            (left >= 8).then(|| e.u32([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]))
        };
        let (start, len) = match type_len {
            0 => {
                let Some(len) = array0() else {
                    return Err(
                        self.error(pos, "event header: length word past the committed data")
                    );
                };
                if len < 4 {
                    return Err(
                        self.error(pos, format!("event header: length {len} is less than 4"))
                    );
                }
                // The length counts itself and is 4-byte aligned by the kernel.
                (pos + 8, ((len as usize - 4) + 3) & !3)
            }
            TYPE_PADDING => {
                match array0() {
                    // A zero delta marks the unused rest of the page.
                    Some(len) if delta != 0 => {
                        // A discarded event; like libtraceevent, keep its delta.
                        self.ts = self.ts.wrapping_add(u64::from(delta));
                        self.pos = (pos + 4).saturating_add(len as usize).min(self.end);
                    }
                    _ => self.pos = self.end,
                }
                return Ok(None);
            }
            TYPE_TIME_EXTEND | TYPE_TIME_STAMP => {
                let Some(ext) = array0() else {
                    return Err(self.error(pos, "time extend past the committed data"));
                };
                let t = (u64::from(ext) << 27) + u64::from(delta);
                self.ts = if type_len == TYPE_TIME_EXTEND {
                    self.ts.wrapping_add(t)
                } else {
                    t | (self.ts & TS_MSB)
                };
                self.pos = pos + 8;
                return Ok(None);
            }
            // 1..=28: the data length in 4-byte words.
            _ => (pos + 4, type_len as usize * 4),
        };
        let stop = start + len;
        if stop > self.end {
            return Err(self.error(
                pos,
                format!(
                    "event of {len} bytes runs past the page's committed data ({} bytes left)",
                    self.end - start.min(self.end)
                ),
            ));
        }
        self.ts = self.ts.wrapping_add(u64::from(delta));
        self.pos = stop;
        let payload = &data[start..stop];
        let Some(event_id) = self
            .common_type
            .u64_checked(payload, e)
            .and_then(|id| u16::try_from(id).ok())
        else {
            return Err(self.error(
                pos,
                format!("record of {len} bytes is too short for its common_type field"),
            ));
        };
        Ok(Some(Entry {
            ts: self.ts_conv.apply(self.ts),
            event_id,
            payload: start..stop,
        }))
    }

    /// The next record's place in the current chunk, reading pages and
    /// chunks as needed; `None` at the end, and after the one error.
    #[inline]
    fn next_located(&mut self) -> Option<Result<Entry, Error>> {
        if self.failed {
            return None;
        }
        loop {
            let step = if self.pos < self.end {
                match self.next_entry() {
                    Ok(Some(entry)) => return Some(Ok(entry)),
                    Ok(None) => Ok(true),
                    Err(e) => Err(e),
                }
            } else {
                self.next_page()
            };
            match step {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The next record, lent in place: unlike the iterator's [`Record`],
    /// it holds no share of the chunk, which saves two atomic reference
    /// count updates per record for readers that decode it at once.
    #[inline]
    pub fn next_ref(&mut self) -> Option<Result<RecordRef<'_>, Error>> {
        Some(self.next_located()?.map(|entry| RecordRef {
            ts: entry.ts,
            cpu: self.cpu,
            event_id: entry.event_id,
            payload: &self.chunk[entry.payload],
        }))
    }

    /// Bytes of this CPU's data read from the file so far (compressed bytes
    /// for compressed files), for progress reports.
    pub fn bytes_read(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// Starts the next page; `Ok(false)` at the end of the CPU's data.
    fn next_page(&mut self) -> Result<bool, Error> {
        loop {
            if self.next_page < self.chunk.len() {
                return self.start_page().map(|()| true);
            }
            if !self.next_chunk()? {
                return Ok(false);
            }
        }
    }

    fn start_page(&mut self) -> Result<(), Error> {
        let l = self.layout;
        let start = self.next_page;
        let page_len = (self.chunk.len() - start).min(l.page_size);
        self.next_page = start + page_len;
        let page = &self.chunk[start..start + page_len];
        if page_len < l.data_off {
            return Err(self.error(
                start,
                format!(
                    "page header: only {page_len} bytes left, the header takes {}",
                    l.data_off
                ),
            ));
        }
        let ts = l.endian.uint(page, 0, 8).unwrap_or(0);
        let commit = l
            .endian
            .uint(page, l.commit_off, l.commit_size)
            .unwrap_or(0);
        let size = (commit & COMMIT_MASK) as usize;
        if l.data_off + size > l.page_size {
            return Err(self.error(
                start,
                format!(
                    "page header: commit size {size} exceeds page size {}",
                    l.page_size
                ),
            ));
        }
        if l.data_off + size > page_len {
            return Err(self.error(
                start,
                format!(
                    "page header: commit size {size} runs past the end of the data ({} bytes left)",
                    page_len - l.data_off
                ),
            ));
        }
        if commit & MISSING_EVENTS != 0 {
            let stored = (commit & MISSING_STORED != 0)
                .then(|| l.endian.uint(page, l.data_off + size, l.commit_size))
                .flatten();
            let missed = stored.unwrap_or(1);
            self.lost = self.lost.saturating_add(missed);
            self.shared.lost.fetch_add(missed, Ordering::Relaxed);
        }
        self.ts = ts;
        self.pos = start + l.data_off;
        self.end = self.pos + size;
        Ok(())
    }

    /// Memory for the next chunk: the spare chunk's when no record holds a
    /// part of it (the current chunk becomes the spare).
    fn recycle(&mut self) -> BytesMut {
        let old = std::mem::replace(&mut self.spare, std::mem::take(&mut self.chunk));
        old.try_into_mut().unwrap_or_default()
    }

    /// Loads the next chunk of pages; `Ok(false)` when there is none.
    fn next_chunk(&mut self) -> Result<bool, Error> {
        let file_len = self.src.len();
        let cpu = self.cpu;
        let cpu_error = |at: u64, what: String| Error::Cpu {
            at: Location::File(at),
            cpu,
            what,
        };
        match self.feed {
            Feed::Done => Ok(false),
            Feed::Raw { next, end } => {
                if next >= end {
                    self.feed = Feed::Done;
                    return Ok(false);
                }
                if next >= file_len {
                    self.feed = Feed::Done;
                    return Err(cpu_error(
                        next,
                        format!(
                            "data truncated: {} more bytes expected, the file ends at {file_len:#x}",
                            end - next
                        ),
                    ));
                }
                let n = (end - next).min(self.raw_chunk as u64).min(file_len - next);
                let buffer = self.recycle();
                self.chunk = self.src.read_into(next, n as usize, buffer, "CPU data")?;
                self.chunk_loc = Location::File(next);
                self.next_page = 0;
                self.feed = Feed::Raw {
                    next: next + n,
                    end,
                };
                self.shared.bytes.fetch_add(n, Ordering::Relaxed);
                Ok(true)
            }
            Feed::CompressedStart { codec, at } => {
                let count = self
                    .src
                    .read(at, 4, "compressed chunk count")
                    .map_err(|e| relabel(e, cpu))?;
                let left = self
                    .layout
                    .endian
                    .u32([count[0], count[1], count[2], count[3]]);
                self.feed = Feed::Compressed {
                    codec,
                    next: at + 4,
                    left,
                };
                self.shared.bytes.fetch_add(4, Ordering::Relaxed);
                self.next_chunk()
            }
            Feed::Compressed { codec, next, left } => {
                if left == 0 {
                    self.feed = Feed::Done;
                    return Ok(false);
                }
                self.feed = Feed::Done; // until this chunk is fully read
                let head = self
                    .src
                    .read(next, 8, "compressed chunk header")
                    .map_err(|e| relabel(e, cpu))?;
                let e = self.layout.endian;
                let csize = e.u32([head[0], head[1], head[2], head[3]]);
                let usize_ = e.u32([head[4], head[5], head[6], head[7]]);
                if usize_ > MAX_CHUNK {
                    return Err(cpu_error(
                        next,
                        format!("compressed chunk claims {usize_} uncompressed bytes (limit {MAX_CHUNK})"),
                    ));
                }
                let packed = self
                    .src
                    .read(next + 8, csize as usize, "compressed chunk")
                    .map_err(|e| relabel(e, cpu))?;
                let plain = codec
                    .decompress(&packed, usize_ as usize)
                    .map_err(|what| cpu_error(next, format!("compressed chunk: {what}")))?;
                self.chunk = Bytes::from(plain);
                self.chunk_loc = Location::Compressed {
                    block: next,
                    offset: 0,
                };
                self.next_page = 0;
                self.feed = Feed::Compressed {
                    codec,
                    next: next + 8 + u64::from(csize),
                    left: left - 1,
                };
                self.shared
                    .bytes
                    .fetch_add(8 + u64::from(csize), Ordering::Relaxed);
                Ok(true)
            }
        }
    }
}

/// Restates a source error as an error of CPU `cpu`.
fn relabel(e: Error, cpu: u32) -> Error {
    match e {
        Error::Malformed { at, what } => Error::Cpu { at, cpu, what },
        other => other,
    }
}

impl Iterator for CpuRecords {
    type Item = Result<Record, Error>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_located()?.map(|entry| Record {
            ts: entry.ts,
            cpu: self.cpu,
            event_id: entry.event_id,
            payload: self.chunk.slice(entry.payload),
        }))
    }
}

/// A record found in the current chunk: its time, event id and where its
/// payload is.
struct Entry {
    ts: u64,
    event_id: u16,
    payload: std::ops::Range<usize>,
}

impl Timestamped for Record {
    fn timestamp(&self) -> u64 {
        self.ts
    }
}

/// The records of all CPUs merged in time order (equal timestamps: lower
/// CPU first).
///
/// An error of one CPU is passed on once; the other CPUs can still be
/// drained by calling `next` again.
pub struct Records {
    merge: Merge<CpuRecords, Record, Error>,
    shared: Arc<Shared>,
}

impl Records {
    pub(crate) fn new(mut cpus: Vec<CpuRecords>) -> Records {
        let shared = Arc::new(Shared::default());
        for c in &mut cpus {
            c.shared = shared.clone();
        }
        Records {
            merge: Merge::new(cpus),
            shared,
        }
    }

    /// Events lost so far, summed over the CPUs (see
    /// [`CpuRecords::lost_events`]).
    pub fn lost_events(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// Bytes of CPU data read from the file so far (compressed bytes for
    /// compressed files), comparable to [`crate::TraceDat::cpu_data_bytes`]
    /// for progress reports.
    pub fn bytes_read(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }
}

impl Iterator for Records {
    type Item = Result<Record, Error>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        self.merge.next()
    }
}
