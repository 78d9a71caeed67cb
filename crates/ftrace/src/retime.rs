//! Copying a trace.dat file with every timestamp put through a clock
//! transform, so that tests can give one host's recording a synthetic clock
//! (an offset and a drift) and check that clock synchronisation recovers it.
//!
//! Only the time fields of the ring-buffer pages change: each page's base
//! timestamp, each event header's 27-bit delta, TIME_EXTEND entries and
//! absolute TIME_STAMP entries. The time of every entry is worked out
//! exactly as [`crate::CpuRecords`] does, mapped, and the deltas re-encoded
//! from the mapped times, so the page layout (commit words, lost-event
//! marks, payloads, padding) stays byte for byte.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::ring::{
    PageLayout, COMMIT_MASK, DELTA_MASK, TS_MSB, TYPE_PADDING, TYPE_TIME_EXTEND, TYPE_TIME_STAMP,
};
use crate::TraceDat;

/// Pages read, rewritten and written back at a time.
const CHUNK_PAGES: usize = 64;
/// A TIME_EXTEND entry holds 27 + 32 bits of delta.
const EXTEND_MAX: u64 = (1 << 59) - 1;
/// Bits of an absolute TIME_STAMP entry (the rest come from the running time).
const STAMP_MASK: u64 = !TS_MSB;

/// What [`retime_trace_dat`] rewrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetimeStats {
    /// Ring-buffer pages, over all buffers and CPUs.
    pub pages: u64,
    /// Records (events) whose time was moved.
    pub records: u64,
    /// TIME_EXTEND entries re-encoded.
    pub time_extends: u64,
    /// Absolute TIME_STAMP entries re-encoded.
    pub time_stamps: u64,
    /// Discarded events (padding with a time delta) re-encoded.
    pub discarded: u64,
}

/// A trace.dat could not be retimed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetimeError {
    /// The input could not be read as a trace.dat file.
    #[error("cannot retime {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: Error,
    },
    /// The input is a valid trace.dat this function does not handle.
    #[error("cannot retime {}: unsupported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("cannot retime into {}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: String,
        #[source]
        source: io::Error,
    },
    /// A page cannot hold its mapped times (or is broken): `page_offset`
    /// is the file offset of the page in the input, `buffer` the instance
    /// name (empty for the top instance).
    #[error(
        "cannot retime {}: {}CPU {cpu}, page at file offset {page_offset:#x}: {reason}",
        path.display(),
        instance_label(buffer)
    )]
    Page {
        path: PathBuf,
        buffer: String,
        cpu: u32,
        page_offset: u64,
        reason: String,
    },
}

fn instance_label(buffer: &str) -> String {
    if buffer.is_empty() {
        String::new()
    } else {
        format!("instance {buffer:?}, ")
    }
}

/// Copies the trace.dat `input` to `output` with every record's time `t`
/// replaced by `map(t)`.
///
/// `t` is the time the reader gives the record ([`crate::Record::ts`], the
/// time `trace-cmd report` prints); reading `output` gives the same records
/// (same CPUs, payloads and order) with time `map(t)`. The file is otherwise
/// kept byte for byte: the page headers (their commit words and lost-event
/// marks), payloads and padding are untouched, and only the page base
/// timestamps and the time deltas, TIME_EXTEND and TIME_STAMP entries are
/// re-encoded from the mapped times (`delta_i = map(t_i) - map(t_{i-1})`, the
/// page base `map(base)`). The output is written as `<output>.partial` and
/// renamed when complete.
///
/// `map` must be non-decreasing. Every mapped delta must also fit the bits of
/// the entry it replaces (27 bits in an event header, 59 in a TIME_EXTEND):
/// a map that stretches time can grow a long delta past them. Both are a
/// [`RetimeError::Page`] naming the CPU and the page, never a panic. A map
/// whose slope is at most 1 (`t + c*t + o` with `c <= 0`, rounding the
/// correction with a non-decreasing rounding) never grows a delta, so a test
/// should shift the host it retimes with a slope below 1: shifting the other
/// host by the inverse, slope-above-1 transform is equivalent. A discarded
/// event (padding with a delta) keeps a delta of at least 1, since a zero
/// delta marks the unused end of a page.
///
/// Only uncompressed v6 files, which deepspan's recorder writes, are
/// supported, without TSC2NSEC scaling (its inverse would be needed) and not
/// cut short. The DATE and OFFSET options are kept: the map applies to the
/// times including their offset. The CPUSTAT options' `oldest event ts`
/// and `now ts` are kept as recorded: they are the kernel's statistics at
/// recording time, which neither deepspan's reader nor `trace-cmd report`
/// uses for the time range (only `report --stat` prints them), and rewriting
/// them could change the options' sizes and so every data offset.
pub fn retime_trace_dat(
    input: &Path,
    output: &Path,
    map: &dyn Fn(u64) -> u64,
) -> Result<RetimeStats, RetimeError> {
    let trace = TraceDat::open(input).map_err(|source| RetimeError::Read {
        path: input.to_path_buf(),
        source,
    })?;
    let unsupported = |what: String| {
        Err(RetimeError::Unsupported {
            path: input.to_path_buf(),
            what,
        })
    };
    if trace.version() != 6 {
        return unsupported(format!(
            "trace.dat version {} (only uncompressed version 6 is supported)",
            trace.version()
        ));
    }
    if let Some(c) = trace.compression() {
        return unsupported(format!("compression {c:?}"));
    }
    let conv = trace.ts_conv();
    if conv.tsc.is_some() {
        return unsupported("TSC2NSEC scaling of the ring-buffer clock".into());
    }
    if trace.truncation().is_some() {
        return unsupported("the file is cut short".into());
    }
    if trace
        .data_spans()
        .any(|(_, _, spans)| spans.iter().any(|s| s.codec.is_some()))
    {
        return unsupported("compressed CPU data".into());
    }

    let partial = partial_path(output);
    let result = copy_and_retime(&trace, input, &partial, map, conv.offset);
    match result {
        Ok(stats) => {
            fs::rename(&partial, output).map_err(|source| RetimeError::Io {
                path: output.to_path_buf(),
                what: format!("renaming {} into place", partial.display()),
                source,
            })?;
            Ok(stats)
        }
        Err(e) => {
            let _ = fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

fn copy_and_retime(
    trace: &TraceDat,
    input: &Path,
    partial: &Path,
    map: &dyn Fn(u64) -> u64,
    offset: i64,
) -> Result<RetimeStats, RetimeError> {
    let io_err = |what: String| {
        move |source| RetimeError::Io {
            path: partial.to_path_buf(),
            what,
            source,
        }
    };
    fs::copy(input, partial).map_err(io_err(format!("copying {}", input.display())))?;
    let mut src = File::open(input).map_err(io_err(format!("opening {}", input.display())))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .open(partial)
        .map_err(io_err("opening the copy".into()))?;

    // Raw ring-buffer time -> record time is `raw + offset` (wrapping, as
    // the reader does), so the raw time that reads as map(t) is
    // map(t) - offset.
    let shift = offset as u64;
    let raw_map = |raw: u64| map(raw.wrapping_add(shift)).wrapping_sub(shift);
    let base_layout = trace.layout();
    let mut stats = RetimeStats::default();
    let mut buf = Vec::new();
    for (name, page_size, spans) in trace.data_spans() {
        let layout = PageLayout {
            page_size: page_size as usize,
            ..base_layout
        };
        let page = layout.page_size as u64;
        for span in spans.iter().filter(|s| s.size > 0) {
            let mut cpu = CpuRetime {
                layout,
                map: &raw_map,
                last: None,
                stats: &mut stats,
            };
            let mut at = span.offset;
            let end = span.offset + span.size;
            while at < end {
                let n = (end - at).min(page * CHUNK_PAGES as u64) as usize;
                buf.resize(n, 0);
                let what = || format!("CPU {} data at offset {at:#x}", span.cpu);
                src.seek(SeekFrom::Start(at))
                    .and_then(|_| src.read_exact(&mut buf))
                    .map_err(|source| RetimeError::Io {
                        path: input.to_path_buf(),
                        what: format!("reading {}", what()),
                        source,
                    })?;
                // A short last page is taken as the reader takes it.
                for (i, p) in buf.chunks_mut(layout.page_size).enumerate() {
                    let page_offset = at + (i * layout.page_size) as u64;
                    cpu.page(p).map_err(|reason| RetimeError::Page {
                        path: input.to_path_buf(),
                        buffer: name.to_string(),
                        cpu: span.cpu,
                        page_offset,
                        reason,
                    })?;
                }
                dst.seek(SeekFrom::Start(at))
                    .and_then(|_| dst.write_all(&buf))
                    .map_err(io_err(format!("writing {}", what())))?;
                at += n as u64;
            }
        }
    }
    dst.sync_all().map_err(io_err("syncing".into()))?;
    Ok(stats)
}

/// The rewriting of one CPU's pages, in order.
struct CpuRetime<'a> {
    layout: PageLayout,
    map: &'a dyn Fn(u64) -> u64,
    /// The last (original, mapped) time, to catch a decreasing map across
    /// pages.
    last: Option<(u64, u64)>,
    stats: &'a mut RetimeStats,
}

impl CpuRetime<'_> {
    /// `map(t)`, checked against the previous time of this CPU.
    fn map(&mut self, t: u64) -> Result<u64, String> {
        let m = (self.map)(t);
        if let Some((lt, lm)) = self.last {
            if t >= lt && m < lm {
                return Err(format!(
                    "the map decreases: {lt} maps to {lm} but the later {t} to {m}"
                ));
            }
        }
        self.last = Some((t, m));
        Ok(m)
    }

    /// Rewrites the time fields of one page in place, walking it exactly as
    /// the reader does (`CpuRecords::start_page` and `next_entry`).
    fn page(&mut self, page: &mut [u8]) -> Result<(), String> {
        let l = self.layout;
        let e = l.endian;
        if page.len() < l.data_off {
            return Err(format!(
                "page header: only {} bytes left, the header takes {}",
                page.len(),
                l.data_off
            ));
        }
        self.stats.pages += 1;
        let base = e.uint(page, 0, 8).unwrap_or(0);
        let commit = e.uint(page, l.commit_off, l.commit_size).unwrap_or(0);
        let size = (commit & COMMIT_MASK) as usize;
        if l.data_off + size > l.page_size.min(page.len()) {
            return Err(format!(
                "page header: commit size {size} runs past the page ({} bytes of data)",
                l.page_size.min(page.len()) - l.data_off
            ));
        }
        let new_base = self.map(base)?;
        put_u64(page, 0, new_base, e.big);
        // The running times of the original and of the rewritten page.
        let mut old = base;
        let mut new = new_base;
        let mut pos = l.data_off;
        let end = l.data_off + size;
        while end - pos >= 4 {
            let left = end - pos;
            let word = get_u32(page, pos, e.big);
            let (type_len, delta) = if e.big {
                (word >> 27, word & DELTA_MASK)
            } else {
                (word & 31, word >> 5)
            };
            let array0 = (left >= 8).then(|| get_u32(page, pos + 4, e.big));
            let stop = match type_len {
                0 => {
                    let len = array0.ok_or_else(|| {
                        format!("entry at page offset {pos}: length word past the committed data")
                    })?;
                    if len < 4 {
                        return Err(format!(
                            "entry at page offset {pos}: length {len} is less than 4"
                        ));
                    }
                    pos + 8 + (((len as usize - 4) + 3) & !3)
                }
                TYPE_PADDING => match array0 {
                    Some(len) if delta != 0 => {
                        old = old.wrapping_add(u64::from(delta));
                        let target = self.map(old)?;
                        // Zero would mark the end of the page.
                        let d = self.delta(pos, target, new, u64::from(DELTA_MASK))?.max(1);
                        put_header(page, pos, type_len, d as u32, e.big);
                        new = new.wrapping_add(d);
                        self.stats.discarded += 1;
                        pos = (pos + 4).saturating_add(len as usize).min(end);
                        continue;
                    }
                    _ => break,
                },
                TYPE_TIME_EXTEND | TYPE_TIME_STAMP => {
                    let ext = array0.ok_or_else(|| {
                        format!("entry at page offset {pos}: time extend past the committed data")
                    })?;
                    let t = (u64::from(ext) << 27) + u64::from(delta);
                    let d;
                    if type_len == TYPE_TIME_EXTEND {
                        old = old.wrapping_add(t);
                        let target = self.map(old)?;
                        d = self.delta(pos, target, new, EXTEND_MAX)?;
                        new = target;
                        self.stats.time_extends += 1;
                    } else {
                        old = t | (old & TS_MSB);
                        // An absolute time may go back; only the top bits
                        // must agree with the running time they come from.
                        let target = (self.map)(old);
                        if target & TS_MSB != new & TS_MSB {
                            return Err(format!(
                                "absolute timestamp at page offset {pos}: mapped time {target:#x} \
                                 differs in its top 5 bits from the running time {new:#x}"
                            ));
                        }
                        self.last = Some((old, target));
                        d = target & STAMP_MASK;
                        new = target;
                        self.stats.time_stamps += 1;
                    }
                    put_header(
                        page,
                        pos,
                        type_len,
                        (d & u64::from(DELTA_MASK)) as u32,
                        e.big,
                    );
                    put_u32(page, pos + 4, (d >> 27) as u32, e.big);
                    pos += 8;
                    continue;
                }
                _ => pos + 4 + type_len as usize * 4,
            };
            if stop > end {
                return Err(format!(
                    "event at page offset {pos} runs past the page's committed data"
                ));
            }
            old = old.wrapping_add(u64::from(delta));
            let target = self.map(old)?;
            let d = self.delta(pos, target, new, u64::from(DELTA_MASK))?;
            put_header(page, pos, type_len, d as u32, e.big);
            new = target;
            self.stats.records += 1;
            pos = stop;
        }
        Ok(())
    }

    /// The delta from the running time `new` to `target`, which must be
    /// non-negative and at most `max`.
    fn delta(&self, pos: usize, target: u64, new: u64, max: u64) -> Result<u64, String> {
        let d = target.checked_sub(new).ok_or_else(|| {
            format!(
                "entry at page offset {pos}: mapped time {target} is before the running time \
                 {new} (the map must be non-decreasing)"
            )
        })?;
        if d > max {
            let bits = 64 - max.leading_zeros();
            return Err(format!(
                "entry at page offset {pos}: mapped delta {d} no longer fits the entry's {bits} \
                 bits (the map stretches time; use a slope of at most 1)"
            ));
        }
        Ok(d)
    }
}

fn get_u32(b: &[u8], at: usize, big: bool) -> u32 {
    let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
    if big {
        u32::from_be_bytes(w)
    } else {
        u32::from_le_bytes(w)
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32, big: bool) {
    let w = if big {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    };
    b[at..at + 4].copy_from_slice(&w);
}

fn put_u64(b: &mut [u8], at: usize, v: u64, big: bool) {
    let w = if big {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    };
    b[at..at + 8].copy_from_slice(&w);
}

/// An event header word with `type_len` and a 27-bit `delta`.
fn put_header(b: &mut [u8], at: usize, type_len: u32, delta: u32, big: bool) {
    debug_assert!(delta <= DELTA_MASK);
    let w = if big {
        (type_len << 27) | delta
    } else {
        (delta << 5) | type_len
    };
    put_u32(b, at, w, big);
}
