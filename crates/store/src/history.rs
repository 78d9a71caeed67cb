//! The state history: every thread's kernel states and every CPU's running
//! threads, on disk in a form that answers a question about one thread or
//! one CPU without loading the run (`analysis/state_history.bin`).
//!
//! It answers, each in O(log n) block reads plus the answer's size:
//! - the state of thread X at t ([`History::state_at`]);
//! - the states of X that overlap [t1, t2) ([`History::window`]);
//! - who ran on CPU c in [t1, t2) (the same on a CPU's lane).
//!
//! # Layout
//!
//! Montplaisir et al.'s state history tree (Trace Compass) keeps all
//! attributes' intervals in one tree of time-ranged nodes, which suits a
//! query for the whole system's state at t. deepspan's readers ask per
//! lane (a thread's row in the UI, one request's threads, one CPU), so each
//! lane's intervals are stored apart, in time order, in blocks:
//!
//! ```text
//! "DSHIST02"                      magic
//! block*                          LZ4 (lz4_flex, size prepended) of up to
//!                                 BLOCK_RECORDS records as varints
//! meta                            JSON: strings, lanes, each lane's block index
//! meta offset u64, meta length u64, "DSHIST02"   (the last 24 bytes)
//! ```
//!
//! A record is its start, end, state, cpu, tid, system call and detail
//! (`encode_block`: varints, the start as a gap after the previous end,
//! the end as a length). Strings are indices into the meta's `strings`
//! (`u32::MAX`: none); `tid` is the waker on a thread's lane and the
//! thread that ran on a CPU's. A lane's intervals do not overlap, so both
//! their starts and their ends are in order, and a block index entry
//! (`first start, last end, offset, length, records`) is found by binary
//! search. The index is the only part read at open: 50 bytes of JSON or so
//! per 256 intervals.
//!
//! Each index entry also keeps its block's summary: the category (state,
//! or thread on a CPU's lane) that covered the most of it, and the time
//! covered. A view zoomed out so far that a whole block is shorter than a
//! pixel takes the summary instead of the block
//! ([`History::coarse_window`]): it reads at most one block per pixel,
//! whatever the run's length. The index is the one coarser level: 256
//! intervals to an entry leaves a 10⁸-interval lane with an index of 20 MB,
//! so no tree of levels above it is kept.
//!
//! Why blocks and not fixed records read one by one: a thread's states
//! follow each other (a gap of 0) and repeat a few values, which varints
//! and LZ4 over a block shrink to about 4 bytes a record (1.3 times the
//! Parquet table, on a 299 MB recording; fixed 40-byte records under LZ4
//! were 3.6 times); a block of 256 records is about the disk page that one
//! record's read would fetch anyway.
//!
//! Invariants: lanes are in key order (threads by tid, then CPUs by
//! number); a lane's records are sorted by start and do not overlap; the
//! file is written into the staging folder and renamed with the rest of
//! the analysis, so a reader never sees half of one.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::Error;

const MAGIC: &[u8; 8] = b"DSHIST02";
/// Records per block.
pub const BLOCK_RECORDS: usize = 256;
const FOOTER_BYTES: u64 = 24;
/// "No string" in a record's string fields.
pub const NO_STRING: u32 = u32::MAX;

/// One interval of a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub start: i64,
    pub end: i64,
    /// The state's name (a string index); on a CPU lane, `RUNNING`.
    pub state: u32,
    /// The CPU it ran on, -1 when not known or not running.
    pub cpu: i32,
    /// On a thread's lane the thread that woke it (-1: none); on a CPU's
    /// lane the thread that ran.
    pub tid: i32,
    /// The system call it waited in (a string index, or [`NO_STRING`]).
    pub syscall: u32,
    /// What else is known (a string index, or [`NO_STRING`]).
    pub detail: u32,
}

/// A block's records, each as varints (LEB128; signed ones zigzagged):
/// its start less the previous record's end (0 on a thread's contiguous
/// states), its length, state, cpu + 1, tid + 1, syscall + 1 and detail + 1
/// (so that "none" is 0). Then LZ4 over the whole block.
fn encode_block(records: &[Record], out: &mut Vec<u8>) {
    let mut previous_end = 0i64;
    for r in records {
        put_signed(out, r.start.wrapping_sub(previous_end));
        put(out, r.end.wrapping_sub(r.start) as u64);
        put(out, u64::from(r.state));
        put_signed(out, i64::from(r.cpu) + 1);
        put_signed(out, i64::from(r.tid) + 1);
        put(out, u64::from(r.syscall.wrapping_add(1)));
        put(out, u64::from(r.detail.wrapping_add(1)));
        previous_end = r.end;
    }
}

/// The records of a block; `None` where the bytes end early, hold a
/// number too large, or hold more than `count` records.
fn decode_block(mut b: &[u8], count: usize) -> Option<Vec<Record>> {
    let mut out = Vec::with_capacity(count);
    let mut previous_end = 0i64;
    while out.len() < count {
        let start = previous_end.wrapping_add(take_signed(&mut b)?);
        let end = start.wrapping_add(take(&mut b)? as i64);
        let r = Record {
            start,
            end,
            state: u32::try_from(take(&mut b)?).ok()?,
            cpu: i32::try_from(take_signed(&mut b)? - 1).ok()?,
            tid: i32::try_from(take_signed(&mut b)? - 1).ok()?,
            syscall: u32::try_from(take(&mut b)?).ok()?.wrapping_sub(1),
            detail: u32::try_from(take(&mut b)?).ok()?.wrapping_sub(1),
        };
        previous_end = end;
        out.push(r);
    }
    b.is_empty().then_some(out)
}

fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_signed(out: &mut Vec<u8>, v: i64) {
    put(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn take(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn take_signed(b: &mut &[u8]) -> Option<i64> {
    let v = take(b)?;
    Some((v >> 1) as i64 ^ -((v & 1) as i64))
}

/// What a lane is the history of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaneKey {
    /// A thread, by its tid.
    Thread(i32),
    /// A CPU, by its number: the threads that ran on it.
    Cpu(i32),
}

/// A lane's description, held in memory once the history is open.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lane {
    pub key: LaneKey,
    /// The thread's process (thread lanes), when known.
    pub pid: Option<i32>,
    /// The thread's first name in the trace (thread lanes).
    pub comm: Option<String>,
    pub records: u64,
    /// Time spent RUNNING, ns.
    pub running_ns: i64,
    /// `(first start, last end, offset, length, records)` of each block.
    blocks: Vec<(i64, i64, u64, u32, u32)>,
    /// Each block's summary for views coarser than it: `(category, its
    /// ns, ns covered by any interval)`, where the category is the state
    /// (thread lanes) or the thread (CPU lanes) that covered the most of
    /// the block. Empty in files written before summaries were kept.
    #[serde(default)]
    summaries: Vec<(u32, i64, i64)>,
}

impl LaneKey {
    /// What tells a record of this lane from its neighbours on a screen:
    /// its state on a thread's lane, its thread on a CPU's.
    pub fn category(self, r: &Record) -> u32 {
        match self {
            LaneKey::Thread(_) => r.state,
            LaneKey::Cpu(_) => r.tid as u32,
        }
    }
}

/// What [`History::walk`] hands over: an interval with its lane index, or
/// a block's index entry with its summary.
enum Walked<'a> {
    Record(u64, &'a Record),
    Block(&'a (i64, i64, u64, u32, u32), &'a (u32, i64, i64)),
}

/// An interval of a lane as a view at some resolution reads it: one
/// interval as recorded, or a whole block of them that is shorter than the
/// resolution, told by its summary ([`History::coarse_window`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coarse {
    /// The interval; for a block, its first start and last end, and its
    /// dominant category as the state (thread lanes) or the tid (CPU
    /// lanes), every other field none.
    pub record: Record,
    /// The intervals it stands for: 1 for an interval as recorded, 2 or
    /// more for a block.
    pub records: u32,
    /// Time its category covered, ns.
    pub category_ns: i64,
    /// Time covered by any interval, ns (a block may hold gaps).
    pub covered_ns: i64,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    strings: Vec<String>,
    /// The strings that are the state of some thread's record.
    states: Vec<u32>,
    lanes: Vec<Lane>,
}

/// A block's summary: the category that covered the most of it, its ns,
/// and the ns of all its intervals.
fn summary(key: LaneKey, records: &[Record]) -> (u32, i64, i64) {
    // A block holds few categories: a short list beats a map.
    let mut by_category: Vec<(u32, i64)> = Vec::with_capacity(8);
    let mut covered = 0;
    for r in records {
        let (category, ns) = (key.category(r), r.end - r.start);
        covered += ns;
        match by_category.iter_mut().find(|c| c.0 == category) {
            Some(c) => c.1 += ns,
            None => by_category.push((category, ns)),
        }
    }
    // Ties go to the category met first in time.
    let (category, ns) = by_category
        .iter()
        .fold(None, |best: Option<(u32, i64)>, &c| match best {
            Some(b) if b.1 >= c.1 => Some(b),
            _ => Some(c),
        })
        .unwrap_or((NO_STRING, 0));
    (category, ns, covered)
}

/// Writes a history: lanes are added whole, in any order, each one's
/// records in time order.
pub struct HistoryWriter {
    path: PathBuf,
    out: BufWriter<File>,
    offset: u64,
    strings: Vec<String>,
    string_ids: FxHashMap<String, u32>,
    lanes: BTreeMap<LaneKey, Lane>,
    states: std::collections::BTreeSet<u32>,
    raw: Vec<u8>,
}

impl HistoryWriter {
    pub fn create(path: &Path) -> Result<HistoryWriter, Error> {
        let file = File::create(path).map_err(|e| io(path, "creating the state history", e))?;
        let mut out = BufWriter::with_capacity(128 << 10, file);
        out.write_all(MAGIC)
            .map_err(|e| io(path, "writing the state history", e))?;
        Ok(HistoryWriter {
            path: path.to_path_buf(),
            out,
            offset: MAGIC.len() as u64,
            strings: Vec::new(),
            string_ids: FxHashMap::default(),
            lanes: BTreeMap::new(),
            states: Default::default(),
            raw: Vec::with_capacity(BLOCK_RECORDS * 16),
        })
    }

    /// The index of `s` in the history's strings.
    pub fn string(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    /// Writes the lane `key` with `records` (sorted by start, not
    /// overlapping). A lane given twice is refused: a bug of the caller.
    pub fn lane(
        &mut self,
        key: LaneKey,
        pid: Option<i32>,
        comm: Option<String>,
        records: impl IntoIterator<Item = Record>,
    ) -> Result<(), Error> {
        if self.lanes.contains_key(&key) {
            return Err(Error::Schema {
                path: self.path.clone(),
                what: format!("lane {key:?} written twice"),
            });
        }
        let running = self.string("RUNNING");
        let mut lane = Lane {
            key,
            pid,
            comm,
            records: 0,
            running_ns: 0,
            blocks: Vec::new(),
            summaries: Vec::new(),
        };
        let mut block: Vec<Record> = Vec::with_capacity(BLOCK_RECORDS);
        let mut last_end = i64::MIN;
        for r in records {
            if r.start < last_end || r.end < r.start {
                return Err(Error::Schema {
                    path: self.path.clone(),
                    what: format!(
                        "lane {key:?}: interval [{}, {}) overlaps the one before or ends before it starts",
                        r.start, r.end
                    ),
                });
            }
            last_end = r.end;
            if matches!(key, LaneKey::Thread(_)) {
                self.states.insert(r.state);
            }
            if r.state == running {
                lane.running_ns += r.end - r.start;
            }
            block.push(r);
            if block.len() == BLOCK_RECORDS {
                self.block(&mut lane, &block)?;
                block.clear();
            }
        }
        if !block.is_empty() {
            self.block(&mut lane, &block)?;
        }
        self.lanes.insert(key, lane);
        Ok(())
    }

    /// Writes CPU `cpu`'s lane from the slices its threads ran (`tid` the
    /// thread), in any order. Two threads RUNNING on one CPU at once is the
    /// model's reading of a trace that lost a switch, and a lane holds one
    /// interval at a time: each slice is cut to start where the one before
    /// ended, and dropped when nothing is left of it.
    pub fn cpu_lane(&mut self, cpu: i32, mut slices: Vec<Record>) -> Result<(), Error> {
        slices.sort_unstable_by_key(|s| (s.start, s.end));
        let mut last_end = i64::MIN;
        let exclusive = slices.into_iter().filter_map(move |mut s| {
            s.start = s.start.max(last_end);
            (s.start < s.end).then(|| {
                last_end = s.end;
                s
            })
        });
        self.lane(LaneKey::Cpu(cpu), None, None, exclusive)
    }

    fn block(&mut self, lane: &mut Lane, records: &[Record]) -> Result<(), Error> {
        self.raw.clear();
        encode_block(records, &mut self.raw);
        let packed = lz4_flex::block::compress_prepend_size(&self.raw);
        self.out
            .write_all(&packed)
            .map_err(|e| io(&self.path, "writing the state history", e))?;
        lane.blocks.push((
            records[0].start,
            records[records.len() - 1].end,
            self.offset,
            packed.len() as u32,
            records.len() as u32,
        ));
        lane.summaries.push(summary(lane.key, records));
        lane.records += records.len() as u64;
        self.offset += packed.len() as u64;
        Ok(())
    }

    /// Writes the meta and the footer; the file's size.
    pub fn finish(mut self) -> Result<u64, Error> {
        let meta = Meta {
            strings: std::mem::take(&mut self.strings),
            states: std::mem::take(&mut self.states).into_iter().collect(),
            lanes: std::mem::take(&mut self.lanes).into_values().collect(),
        };
        let json = serde_json::to_vec(&meta).map_err(|e| Error::Json {
            path: self.path.clone(),
            at: None,
            source: e,
        })?;
        let write = |out: &mut BufWriter<File>, bytes: &[u8]| out.write_all(bytes);
        write(&mut self.out, &json)
            .and_then(|_| write(&mut self.out, &self.offset.to_le_bytes()))
            .and_then(|_| write(&mut self.out, &(json.len() as u64).to_le_bytes()))
            .and_then(|_| write(&mut self.out, MAGIC))
            .and_then(|_| self.out.flush())
            .map_err(|e| io(&self.path, "writing the state history", e))?;
        Ok(self.offset + json.len() as u64 + FOOTER_BYTES)
    }
}

/// An open history: its strings and lanes in memory, intervals read from
/// disk as asked.
pub struct History {
    path: PathBuf,
    file: File,
    strings: Vec<String>,
    states: Vec<u32>,
    lanes: Vec<Lane>,
    by_key: FxHashMap<LaneKey, usize>,
}

impl History {
    /// Opens `path`, reading its meta only.
    pub fn open(path: &Path) -> Result<History, Error> {
        let file = File::open(path).map_err(|e| io(path, "opening the state history", e))?;
        let len = file
            .metadata()
            .map_err(|e| io(path, "reading the state history's size", e))?
            .len();
        let bad = |what: String| Error::Schema {
            path: path.to_path_buf(),
            what: format!("not a deepspan state history: {what}"),
        };
        if len < MAGIC.len() as u64 + FOOTER_BYTES {
            return Err(bad(format!("{len} bytes, too short")));
        }
        let mut footer = [0u8; FOOTER_BYTES as usize];
        file.read_exact_at(&mut footer, len - FOOTER_BYTES)
            .map_err(|e| io(path, "reading the state history's footer", e))?;
        if &footer[16..] != MAGIC {
            return Err(bad("no end marker (a file cut short?)".into()));
        }
        let meta_offset = u64::from_le_bytes(footer[0..8].try_into().unwrap());
        let meta_len = u64::from_le_bytes(footer[8..16].try_into().unwrap());
        if meta_offset.checked_add(meta_len) != Some(len - FOOTER_BYTES) {
            return Err(bad(format!(
                "its meta at {meta_offset} (+{meta_len}) does not end at the footer"
            )));
        }
        let mut json = vec![0u8; meta_len as usize];
        file.read_exact_at(&mut json, meta_offset)
            .map_err(|e| io(path, "reading the state history's meta", e))?;
        let meta: Meta = serde_json::from_slice(&json).map_err(|e| Error::Json {
            path: path.to_path_buf(),
            at: None,
            source: e,
        })?;
        for lane in &meta.lanes {
            if !lane.summaries.is_empty() && lane.summaries.len() != lane.blocks.len() {
                return Err(bad(format!(
                    "lane {:?} has {} block summaries for {} blocks",
                    lane.key,
                    lane.summaries.len(),
                    lane.blocks.len()
                )));
            }
            if let Some(b) = lane
                .blocks
                .iter()
                .find(|b| b.2.saturating_add(u64::from(b.3)) > meta_offset)
            {
                return Err(bad(format!(
                    "lane {:?} has a block at {} past its data",
                    lane.key, b.2
                )));
            }
        }
        let by_key = meta
            .lanes
            .iter()
            .enumerate()
            .map(|(i, l)| (l.key, i))
            .collect();
        Ok(History {
            path: path.to_path_buf(),
            file,
            strings: meta.strings,
            states: meta.states,
            lanes: meta.lanes,
            by_key,
        })
    }

    /// The names of the states the threads were in.
    pub fn states(&self) -> impl Iterator<Item = &str> {
        self.states.iter().filter_map(|&id| self.string(id))
    }

    /// From the earliest start to the latest end of any lane; `None` for a
    /// history without intervals.
    pub fn range(&self) -> Option<(i64, i64)> {
        let firsts = self.lanes.iter().filter_map(|l| l.blocks.first());
        let start = firsts.map(|b| b.0).min()?;
        // Ends are in order within a lane: its last block's is its latest.
        let end = self
            .lanes
            .iter()
            .filter_map(|l| l.blocks.last())
            .map(|b| b.1)
            .max()?;
        Some((start, end))
    }

    /// Intervals of all thread lanes.
    pub fn thread_intervals(&self) -> u64 {
        self.lanes
            .iter()
            .filter(|l| matches!(l.key, LaneKey::Thread(_)))
            .map(|l| l.records)
            .sum()
    }

    /// Every lane, threads by tid, then CPUs by number.
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    pub fn lane(&self, key: LaneKey) -> Option<&Lane> {
        self.by_key.get(&key).map(|&i| &self.lanes[i])
    }

    /// The string of a record's field; `None` for [`NO_STRING`] or an
    /// index the history does not have.
    pub fn string(&self, id: u32) -> Option<&str> {
        self.strings.get(id as usize).map(String::as_str)
    }

    /// The interval of `key` that holds `t`, with its index in the lane;
    /// `None` when the lane has none there (or no such lane).
    pub fn state_at(&self, key: LaneKey, t: i64) -> Result<Option<(u64, Record)>, Error> {
        let Some(lane) = self.lane(key) else {
            return Ok(None);
        };
        // The first block whose last interval ends after t.
        let b = lane.blocks.partition_point(|b| b.1 <= t);
        let Some(block) = lane.blocks.get(b) else {
            return Ok(None);
        };
        let records = self.read_block(lane, block)?;
        let i = records.partition_point(|r| r.end <= t);
        Ok(records
            .get(i)
            .filter(|r| r.start <= t)
            .map(|r| (self.first_index(b) + i as u64, *r)))
    }

    /// The intervals of `key` that overlap `[from, to)`, in time order,
    /// and the lane index of the first. At most `limit` are read; the
    /// flag says whether more overlap.
    pub fn window(
        &self,
        key: LaneKey,
        from: i64,
        to: i64,
        limit: usize,
    ) -> Result<(u64, Vec<Record>, bool), Error> {
        let mut out = Vec::new();
        let mut first = None;
        let more = self.walk(key, from, to, 0, |walked| {
            let Walked::Record(i, r) = walked else {
                unreachable!("no block is summarised at resolution 0")
            };
            if out.len() == limit {
                return false;
            }
            first.get_or_insert(i);
            out.push(*r);
            true
        })?;
        Ok((first.unwrap_or(0), out, more))
    }

    /// Calls `each` with every interval of `key` that overlaps `[from,
    /// to)`, in time order, holding one block in memory at a time (a
    /// [`History::window`] without the collected answer).
    pub fn visit(
        &self,
        key: LaneKey,
        from: i64,
        to: i64,
        mut each: impl FnMut(&Record),
    ) -> Result<(), Error> {
        self.walk(key, from, to, 0, |walked| {
            if let Walked::Record(_, r) = walked {
                each(r);
            }
            true
        })?;
        Ok(())
    }

    /// The intervals of `key` that overlap `[from, to)` as a view of
    /// `resolution` ns per pixel needs them, in time order: a block of two
    /// intervals or more that lies inside the window and is shorter than
    /// `resolution` comes as its summary, without being read; the rest
    /// come as recorded. So a window reads at most one block per pixel
    /// (plus the two at its edges), however many intervals it holds. At
    /// most `limit` are returned; the flag says whether more overlap.
    pub fn coarse_window(
        &self,
        key: LaneKey,
        from: i64,
        to: i64,
        resolution: i64,
        limit: usize,
    ) -> Result<(Vec<Coarse>, bool), Error> {
        let mut out = Vec::new();
        let more = self.walk(key, from, to, resolution, |walked| {
            if out.len() == limit {
                return false;
            }
            out.push(match walked {
                Walked::Record(_, r) => Coarse {
                    record: *r,
                    records: 1,
                    category_ns: r.end - r.start,
                    covered_ns: r.end - r.start,
                },
                Walked::Block(block, summary) => {
                    let &(start, end, _, _, count) = block;
                    let (category, category_ns, covered_ns) = *summary;
                    let mut record = Record {
                        start,
                        end,
                        state: NO_STRING,
                        cpu: -1,
                        tid: -1,
                        syscall: NO_STRING,
                        detail: NO_STRING,
                    };
                    match key {
                        LaneKey::Thread(_) => record.state = category,
                        LaneKey::Cpu(_) => record.tid = category as i32,
                    }
                    Coarse {
                        record,
                        records: count,
                        category_ns,
                        covered_ns,
                    }
                }
            });
            true
        })?;
        Ok((out, more))
    }

    /// Gives `each` what a view of `resolution` ns per pixel reads of
    /// `key` over `[from, to)`, in time order, until it answers false;
    /// whether it did. A block of two intervals or more that lies inside
    /// the window and is shorter than `resolution` comes as its summary
    /// (when the file has summaries) and is not read; every other interval
    /// that overlaps the window comes with its lane index.
    fn walk(
        &self,
        key: LaneKey,
        from: i64,
        to: i64,
        resolution: i64,
        mut each: impl FnMut(Walked) -> bool,
    ) -> Result<bool, Error> {
        let Some(lane) = self.lane(key) else {
            return Ok(false);
        };
        let summaries = (lane.summaries.len() == lane.blocks.len()).then_some(&lane.summaries);
        let first_block = lane.blocks.partition_point(|b| b.1 <= from);
        for (b, block) in lane.blocks.iter().enumerate().skip(first_block) {
            let &(start, end, _, _, count) = block;
            if start >= to {
                break;
            }
            if let Some(summaries) = summaries
                .filter(|_| count >= 2 && start >= from && end <= to && end - start < resolution)
            {
                if !each(Walked::Block(block, &summaries[b])) {
                    return Ok(true);
                }
                continue;
            }
            let records = self.read_block(lane, block)?;
            let skip = records.partition_point(|r| r.end <= from);
            for (i, r) in records.iter().enumerate().skip(skip) {
                if r.start >= to {
                    return Ok(false);
                }
                if !each(Walked::Record(self.first_index(b) + i as u64, r)) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The lane index of block `b`'s first record.
    fn first_index(&self, b: usize) -> u64 {
        // Every block but a lane's last is full.
        (b * BLOCK_RECORDS) as u64
    }

    fn read_block(
        &self,
        lane: &Lane,
        block: &(i64, i64, u64, u32, u32),
    ) -> Result<Vec<Record>, Error> {
        let &(_, _, offset, len, count) = block;
        let mut packed = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut packed, offset)
            .map_err(|e| io(&self.path, "reading the state history", e))?;
        let raw =
            lz4_flex::block::decompress_size_prepended(&packed).map_err(|e| Error::Schema {
                path: self.path.clone(),
                what: format!(
                    "lane {:?}: block at {offset} does not decompress: {e}",
                    lane.key
                ),
            })?;
        decode_block(&raw, count as usize).ok_or_else(|| Error::Schema {
            path: self.path.clone(),
            what: format!(
                "lane {:?}: block at {offset} does not hold {count} records",
                lane.key
            ),
        })
    }
}

fn io(path: &Path, what: &str, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        what: what.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(start: i64, end: i64, state: u32, tid: i32) -> Record {
        Record {
            start,
            end,
            state,
            cpu: 0,
            tid,
            syscall: NO_STRING,
            detail: NO_STRING,
        }
    }

    /// A history of one thread with `n` intervals of 10 ns, 2 ns apart,
    /// RUNNING every third, and a CPU lane.
    fn written(n: i64) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.bin");
        let mut w = HistoryWriter::create(&path).unwrap();
        let running = w.string("RUNNING");
        let sleeping = w.string("SLEEPING");
        let records: Vec<Record> = (0..n)
            .map(|i| {
                record(
                    i * 12,
                    i * 12 + 10,
                    if i % 3 == 0 { running } else { sleeping },
                    -1,
                )
            })
            .collect();
        w.lane(LaneKey::Thread(7), Some(7), Some("worker".into()), records)
            .unwrap();
        w.lane(LaneKey::Cpu(1), None, None, [record(5, 9, running, 7)])
            .unwrap();
        w.finish().unwrap();
        (dir, path)
    }

    #[test]
    fn a_coarse_window_summarises_the_blocks_shorter_than_a_pixel() {
        let (_dir, path) = written(1000);
        let mut h = History::open(&path).unwrap();
        let key = LaneKey::Thread(7);
        let running = h.strings.iter().position(|s| s == "RUNNING").unwrap() as u32;
        let sleeping = h.strings.iter().position(|s| s == "SLEEPING").unwrap() as u32;
        // At 1 ns per pixel every interval comes as recorded.
        let (fine, more) = h.coarse_window(key, 0, 12_000, 1, usize::MAX).unwrap();
        let (_, exact, _) = h.window(key, 0, 12_000, usize::MAX).unwrap();
        assert!(!more);
        assert_eq!(fine.iter().map(|c| c.record).collect::<Vec<_>>(), exact);
        assert!(fine.iter().all(|c| c.records == 1 && c.covered_ns == 10));
        // Blocks span 256 × 12 ns: at 4000 ns per pixel the four blocks
        // inside the window come as summaries.
        let (coarse, _) = h.coarse_window(key, 0, 12_000, 4_000, usize::MAX).unwrap();
        let records: Vec<u32> = coarse.iter().map(|c| c.records).collect();
        assert_eq!(records, [256, 256, 256, 232]);
        // Block 0: intervals 0..256, RUNNING for the 86 whose index is a
        // multiple of 3.
        let first = coarse[0];
        assert_eq!((first.record.start, first.record.end), (0, 255 * 12 + 10));
        assert_eq!(
            (first.record.state, first.category_ns, first.covered_ns),
            (sleeping, 170 * 10, 256 * 10)
        );
        assert_eq!((first.record.tid, first.record.syscall), (-1, NO_STRING));
        // A block the window cuts is read: its intervals from the window's
        // start, then the summaries.
        let (cut, _) = h
            .coarse_window(key, 100, 12_000, 4_000, usize::MAX)
            .unwrap();
        assert_eq!(cut[0].record.start, 8 * 12);
        assert_eq!(cut.iter().filter(|c| c.records == 1).count(), 256 - 8);
        assert_eq!(cut.iter().filter(|c| c.records > 1).count(), 3);
        // The limit holds for summaries too.
        assert_eq!(
            h.coarse_window(key, 0, 12_000, 4_000, 2).unwrap(),
            (coarse[..2].to_vec(), true)
        );
        // The CPU lane's category is its thread; a block of one interval
        // is read, not summarised.
        let (cpu, _) = h.coarse_window(LaneKey::Cpu(1), 0, 100, 1_000, 10).unwrap();
        assert_eq!((cpu.len(), cpu[0].records, cpu[0].record.tid), (1, 1, 7));
        assert_eq!(LaneKey::Cpu(1).category(&cpu[0].record), 7);
        assert_eq!(LaneKey::Thread(7).category(&fine[0].record), running);
        // A file written before summaries reads every block.
        h.lanes.iter_mut().for_each(|l| l.summaries.clear());
        let (old, _) = h.coarse_window(key, 0, 12_000, 4_000, usize::MAX).unwrap();
        assert_eq!(old, fine);
    }

    #[test]
    fn a_state_at_a_time_and_a_window_are_what_was_written() {
        let (_dir, path) = written(1000);
        let h = History::open(&path).unwrap();
        assert_eq!(h.lanes().len(), 2);
        let lane = h.lane(LaneKey::Thread(7)).unwrap();
        assert_eq!((lane.records, lane.comm.as_deref()), (1000, Some("worker")));
        assert_eq!(lane.running_ns, 334 * 10);
        // Inside the 600th interval, in a gap, past the end.
        let (i, r) = h
            .state_at(LaneKey::Thread(7), 600 * 12 + 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            (i, r.start, h.string(r.state)),
            (600, 7200, Some("RUNNING"))
        );
        assert_eq!(h.state_at(LaneKey::Thread(7), 600 * 12 + 11).unwrap(), None);
        assert_eq!(h.state_at(LaneKey::Thread(7), 12_000).unwrap(), None);
        assert_eq!(h.state_at(LaneKey::Thread(8), 0).unwrap(), None);
        // A window across blocks (256 records each), cut at its limit.
        let (first, rs, more) = h
            .window(LaneKey::Thread(7), 250 * 12 + 5, 260 * 12, 100)
            .unwrap();
        assert_eq!((first, rs.len(), more), (250, 10, false));
        assert!(rs.windows(2).all(|p| p[0].end <= p[1].start));
        let (_, rs, more) = h.window(LaneKey::Thread(7), 0, i64::MAX, 300).unwrap();
        assert_eq!((rs.len(), more), (300, true));
        let mut visited = Vec::new();
        h.visit(LaneKey::Thread(7), 250 * 12 + 5, 260 * 12, |r| {
            visited.push(*r)
        })
        .unwrap();
        let (_, window, _) = h
            .window(LaneKey::Thread(7), 250 * 12 + 5, 260 * 12, 100)
            .unwrap();
        assert_eq!(visited, window);
        let (_, cpu, _) = h.window(LaneKey::Cpu(1), 0, 100, 10).unwrap();
        assert_eq!(cpu[0].tid, 7);
        assert_eq!(h.range(), Some((0, 999 * 12 + 10)));
        assert_eq!(h.states().collect::<Vec<_>>(), ["RUNNING", "SLEEPING"]);
        assert_eq!(h.thread_intervals(), 1000);
    }

    #[test]
    fn records_come_back_as_written_at_the_edges_of_their_fields() {
        let records = [
            Record {
                start: i64::MIN + 1,
                end: -5,
                state: 0,
                cpu: -1,
                tid: -1,
                syscall: NO_STRING,
                detail: NO_STRING,
            },
            Record {
                start: 0,
                end: i64::MAX,
                state: u32::MAX - 1,
                cpu: i32::MAX - 1,
                tid: i32::MIN + 1,
                syscall: 0,
                detail: u32::MAX - 1,
            },
        ];
        let mut raw = Vec::new();
        encode_block(&records, &mut raw);
        assert_eq!(decode_block(&raw, 2).as_deref(), Some(&records[..]));
        // Cut short, or with a record too many: refused, not misread.
        assert_eq!(decode_block(&raw[..raw.len() - 1], 2), None);
        assert_eq!(decode_block(&raw, 1), None);
    }

    #[test]
    fn overlapping_intervals_and_a_damaged_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.bin");
        let mut w = HistoryWriter::create(&path).unwrap();
        let err = w
            .lane(
                LaneKey::Thread(1),
                None,
                None,
                [record(0, 10, 0, -1), record(5, 20, 0, -1)],
            )
            .unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{err}");

        let (_dir, path) = written(100);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = History::open(&path).err().expect("a cut file is refused");
        assert!(
            err.to_string().contains("not a deepspan state history"),
            "{err}"
        );
        // A block's bytes damaged: its read says which lane and where.
        let mut damaged = bytes.clone();
        for b in &mut damaged[8..40] {
            *b = 0xff;
        }
        std::fs::write(&path, &damaged).unwrap();
        let h = History::open(&path).unwrap();
        let err = h.state_at(LaneKey::Thread(7), 5).unwrap_err();
        assert!(err.to_string().contains("Thread(7)"), "{err}");
    }
}
