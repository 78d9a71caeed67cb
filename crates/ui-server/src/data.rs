//! A run's analysis in the shapes the API serves. Thread states per thread
//! and per CPU stay on disk, in the state history
//! (`deepspan_store::history`), read a lane and a window at a time as the
//! UI pans and zooms. A request's critical-path pieces and the pieces of
//! its queue (its time at its host before its span started,
//! `queue_path.parquet`: absent from older analyses, then no request has
//! queue pieces) are read when a page first asks for them, only their own
//! rows of the tables ([`RequestPieces`]), and the most recently used are
//! kept up to [`PIECES_KEPT`] pieces. Loaded once into memory: summaries,
//! `requests.json`, and the spans of each trace. Opening a run therefore
//! costs about its requests, not its kernel trace.
//!
//! Every file is opened through [`RunDir::file`], which refuses anything
//! that resolves (symlinks included) outside the run folder.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use deepspan_analysis::MAX_HOSTS;
use deepspan_run::analysis::{
    CRITICAL_PATH, PLACEMENTS_JSON, QUEUE_PATH, REQUESTS_JSON, REQUEST_SUMMARY, REQUEST_SYSCALLS,
    STATE_HISTORY,
};
use deepspan_run::{layout, HostsFile, Run};
use deepspan_spans::{critical_path, group_traces, ClockMap, CriticalPathOptions, Span, Trace};
use deepspan_store::history::{Coarse, History, LaneKey};
use deepspan_store::json::{RequestEntry, RequestsDoc, TableRows};
use deepspan_store::placements::{read_placements_json, PlacementRecord};
use deepspan_store::rows::{for_each_row, for_each_row_in, text_runs};
use deepspan_store::tables::{RequestSummaryRow, RequestSyscallRow};

use crate::lod::Interval;

/// Why run data could not be served.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{0}")]
    Missing(String),
    #[error("{path} resolves to {resolved}, outside the run folder {run}: refused")]
    Outside {
        path: String,
        resolved: String,
        run: String,
    },
    #[error("{0}")]
    Bad(String),
}

/// The run folder, canonicalized once.
#[derive(Clone, Debug)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Opens a run folder: it must exist and hold `analysis/requests.json`.
    pub fn open(path: &Path) -> Result<RunDir, DataError> {
        let root = path.canonicalize().map_err(|e| {
            DataError::Missing(format!("cannot open run folder {}: {e}", path.display()))
        })?;
        if !root.is_dir() {
            return Err(DataError::Missing(format!(
                "{} is not a folder",
                path.display()
            )));
        }
        let run = RunDir { root };
        let requests = Run::new(&run.root).requests_json();
        if !requests.is_file() {
            return Err(DataError::Missing(format!(
                "{} has no analysis ({} is missing): run `deepspan analyze {}` first",
                path.display(),
                requests.display(),
                path.display()
            )));
        }
        Ok(run)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `relative` inside the run folder, after following symlinks; an error
    /// if it does not exist or leads outside the folder.
    pub fn file(&self, relative: &str) -> Result<PathBuf, DataError> {
        let joined = self.root.join(relative);
        let resolved = joined.canonicalize().map_err(|e| {
            DataError::Missing(format!("{} is not readable: {e}", joined.display()))
        })?;
        if !resolved.starts_with(&self.root) {
            return Err(DataError::Outside {
                path: joined.display().to_string(),
                resolved: resolved.display().to_string(),
                run: self.root.display().to_string(),
            });
        }
        Ok(resolved)
    }

    fn analysis(&self, table: &str) -> Result<PathBuf, DataError> {
        self.file(&format!("{}/{table}", layout::ANALYSIS_DIR))
    }

    /// As [`RunDir::analysis`] for a file older analyses did not write:
    /// None when nothing is there under that name (not even a dangling
    /// symlink); one there that leads outside the run is still refused.
    fn optional_analysis(&self, table: &str) -> Result<Option<PathBuf>, DataError> {
        let relative = format!("{}/{table}", layout::ANALYSIS_DIR);
        if std::fs::symlink_metadata(self.root.join(&relative)).is_err() {
            return Ok(None);
        }
        self.file(&relative).map(Some)
    }
}

/// Strings stored once; intervals refer to them by index.
#[derive(Default)]
pub struct Strings {
    index: HashMap<String, u32>,
    pub names: Vec<String>,
}

/// "No string".
pub const NONE: u32 = u32::MAX;

impl Strings {
    pub fn intern(&mut self, s: Option<&str>) -> u32 {
        let Some(s) = s else { return NONE };
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    pub fn get(&self, i: u32) -> Option<&str> {
        self.names.get(i as usize).map(String::as_str)
    }
}

/// An interval of a history lane, or a summary of a block of them, as the
/// level of detail sees it: its category is the lane's
/// ([`LaneKey::category`]: the state of a thread, the thread of a CPU).
#[derive(Clone, Copy, Debug)]
pub struct LaneInterval(pub LaneKey, pub Coarse);

impl Interval for LaneInterval {
    fn start(&self) -> i64 {
        self.1.record.start
    }
    fn end(&self) -> i64 {
        self.1.record.end
    }
    fn category(&self) -> u32 {
        self.0.category(&self.1.record)
    }
    fn intervals(&self) -> u32 {
        self.1.records
    }
    fn category_ns(&self) -> i64 {
        self.1.category_ns
    }
    fn covered_ns(&self) -> i64 {
        self.1.covered_ns
    }
}

/// A piece of a request's kernel critical path.
#[derive(Clone, Debug)]
pub struct Piece {
    pub start: i64,
    pub end: i64,
    pub state: u32,
    pub tid: Option<i32>,
    pub comm: u32,
    pub syscall: u32,
    pub waiting_in: u32,
    pub detail: u32,
    pub blocked_by_request: u32,
    pub shared: i32,
    pub lost: bool,
    pub preempted_by_tid: Option<i32>,
    pub preempted_by_comm: u32,
    pub throttled_ns: i64,
    pub contended_ns: i64,
    pub wakeup_ns: i64,
}

impl Interval for Piece {
    fn start(&self) -> i64 {
        self.start
    }
    fn end(&self) -> i64 {
        self.end
    }
    fn category(&self) -> u32 {
        self.state
    }
}

/// Everything loaded from `RUN/analysis/`.
pub struct RunData {
    pub dir: RunDir,
    /// `requests.json`.
    pub requests_doc: RequestsDoc,
    /// span id → index in `requests_doc.requests`.
    pub request_index: HashMap<String, usize>,
    /// Every thread's states and every CPU's threads, on disk.
    pub history: History,
    /// Each request's pieces, read from disk when first asked for.
    pieces: PieceTables,
    /// Request span id → its summary rows.
    pub summaries: HashMap<String, Vec<RequestSummaryRow>>,
    /// Request span id → `(system call, ns)`, largest first.
    pub syscalls: HashMap<String, Vec<(String, i64)>>,
    /// Total thread-state intervals.
    pub intervals: u64,
    /// First and last instant of the kernel data.
    pub range: (i64, i64),
    /// Request span id → how it was placed without deepspan fields (its
    /// `analysis/placements.json` record: sync, pid, tid, confidence,
    /// evidence); empty when every span was placed by the SDK.
    pub placements: HashMap<String, PlacementRecord>,
    /// The hosts of a merged run (`hosts.json`): None for a run of one
    /// host, `Err` (what was wrong) when the file is there but unreadable.
    pub hosts: Option<Result<Vec<HostInfo>, String>>,
}

/// One host of a merged run, as `/api/run` lists it. `index` is the host
/// number in its threads' ids (`tid >> 22`, shown as `hN:`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HostInfo {
    pub index: usize,
    pub host: String,
    /// This host's clock is the merged run's.
    pub reference: bool,
    /// `deepspan sync`'s quality of the clock transform.
    pub quality: String,
    /// Messages matched to align the clock.
    pub matched: u64,
    /// The host's clock onto the reference's: `slope · t + offset_ns`.
    pub slope: f64,
    pub offset_ns: f64,
    /// The host's own run folder.
    pub run: String,
}

/// `hosts.json` of `dir`: None when the run has none (an ordinary run),
/// else the hosts or what is wrong with the file. Opened through
/// [`RunDir::file`], so a symlink out of the run is refused.
pub fn load_hosts(dir: &RunDir) -> Option<Result<Vec<HostInfo>, String>> {
    // Nothing at all under that name (not even a dangling symlink).
    if std::fs::symlink_metadata(Run::new(dir.root()).hosts()).is_err() {
        return None;
    }
    Some(read_hosts(dir))
}

fn read_hosts(dir: &RunDir) -> Result<Vec<HostInfo>, String> {
    let path = dir.file(layout::HOSTS).map_err(|e| e.to_string())?;
    let bytes =
        std::fs::read(&path).map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
    let file = HostsFile::parse(&bytes, &path).map_err(|e| e.to_string())?;
    if file.hosts.len() > MAX_HOSTS {
        return Err(format!(
            "{}: {} hosts; thread ids number at most {MAX_HOSTS}",
            path.display(),
            file.hosts.len()
        ));
    }
    Ok(file
        .hosts
        .into_iter()
        .enumerate()
        .map(|(index, h)| HostInfo {
            index,
            host: h.host,
            reference: index == file.reference,
            quality: h.quality,
            matched: h.matched,
            slope: h.slope,
            offset_ns: h.offset_ns,
            run: h.run.display().to_string(),
        })
        .collect())
}

fn store_err(e: deepspan_store::Error) -> DataError {
    DataError::Bad(e.to_string())
}

impl RunData {
    /// Loads the analysis of `dir`.
    pub fn load(dir: RunDir) -> Result<RunData, DataError> {
        let json_path = dir.analysis(REQUESTS_JSON)?;
        // Written by analyses that placed spans from the kernel trace only.
        let placements_path = dir.analysis(PLACEMENTS_JSON).ok();
        let requests_doc: RequestsDoc =
            serde_json::from_slice(&std::fs::read(&json_path).map_err(|e| {
                DataError::Missing(format!("cannot read {}: {e}", json_path.display()))
            })?)
            .map_err(|e| {
                DataError::Bad(format!(
                    "{} is not an analysis's requests.json: {e}",
                    json_path.display()
                ))
            })?;
        let request_index: HashMap<String, usize> = requests_doc
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (r.span_id.clone(), i))
            .collect();

        let history_path = dir.analysis(STATE_HISTORY).map_err(|e| match e {
            DataError::Missing(m) => DataError::Missing(format!(
                "{m} (an analysis made before the state history: run `deepspan analyze` again)"
            )),
            other => other,
        })?;
        let history = History::open(&history_path).map_err(store_err)?;
        let intervals = history.thread_intervals();
        let mut range = history.range().unwrap_or((i64::MAX, i64::MIN));

        let pieces = PieceTables {
            critical_path: PieceTable::new(dir.analysis(CRITICAL_PATH)?),
            queue_path: dir.optional_analysis(QUEUE_PATH)?.map(PieceTable::new),
            kept: Mutex::default(),
        };

        let mut summaries: HashMap<String, Vec<RequestSummaryRow>> = HashMap::new();
        for_each_row(&dir.analysis(REQUEST_SUMMARY)?, |r: RequestSummaryRow| {
            summaries.entry(r.span_id.clone()).or_default().push(r);
        })
        .map_err(store_err)?;
        let mut syscalls: HashMap<String, Vec<(String, i64)>> = HashMap::new();
        for_each_row(&dir.analysis(REQUEST_SYSCALLS)?, |r: RequestSyscallRow| {
            syscalls
                .entry(r.span_id)
                .or_default()
                .push((r.syscall, r.ns));
        })
        .map_err(store_err)?;
        for v in syscalls.values_mut() {
            v.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
        }
        if range.0 > range.1 {
            let t = &requests_doc.trace;
            range = (t.start_ns as i64, t.end_ns as i64);
        }
        let hosts = load_hosts(&dir);
        Ok(RunData {
            dir,
            requests_doc,
            request_index,
            history,
            pieces,
            summaries,
            syscalls,
            intervals,
            range,
            placements: load_placements(&placements_path)?,
            hosts,
        })
    }

    /// The `requests.json` entry of a request, by span id.
    pub fn request(&self, span_id: &str) -> Option<&RequestEntry> {
        let i = *self.request_index.get(span_id)?;
        self.requests_doc.requests.get(i)
    }

    pub fn requests(&self) -> &[RequestEntry] {
        &self.requests_doc.requests
    }
}

/// Pieces kept in memory at most, over the requests last asked for (a
/// piece is about 100 bytes); a request with more is still served, alone.
pub const PIECES_KEPT: usize = 2_000_000;

/// One request's pieces as the UI shows them: its path's and its queue's,
/// each in path order with the pieces that differ only in the span worked
/// for joined ([`join_onto`]), and the strings they refer to.
#[derive(Default)]
pub struct RequestPieces {
    pub path: Vec<Piece>,
    /// `[arrival, start)`; empty when the analysis has no queue pieces.
    pub queue: Vec<Piece>,
    pub strings: Strings,
}

impl RequestPieces {
    /// The string a piece's field refers to ([`NONE`]: none).
    pub fn name(&self, i: u32) -> Option<&str> {
        if i == NONE {
            None
        } else {
            self.strings.get(i)
        }
    }

    fn len(&self) -> usize {
        self.path.len() + self.queue.len()
    }

    fn list(&mut self, queue: bool) -> &mut Vec<Piece> {
        if queue {
            &mut self.queue
        } else {
            &mut self.path
        }
    }
}

/// The tables of pieces, and the requests' pieces last read from them.
struct PieceTables {
    critical_path: PieceTable,
    /// None in analyses made before queues.
    queue_path: Option<PieceTable>,
    kept: Mutex<KeptPieces>,
}

/// A table in `critical_path`'s columns (`critical_path`, `queue_path`).
struct PieceTable {
    file: PathBuf,
    /// Where each request's rows are, for analyses whose `requests.json`
    /// does not say (made before it did): found by one scan of the table's
    /// `span_id` column, the first time it is needed.
    runs: OnceLock<Result<RowsBySpan, String>>,
}

/// Request span id → its rows in a table.
type RowsBySpan = HashMap<String, Vec<Range<u64>>>;

/// The most recently used requests' pieces, up to `budget` pieces.
struct KeptPieces {
    by_span: HashMap<String, (Arc<RequestPieces>, u64)>,
    pieces: usize,
    clock: u64,
    budget: usize,
}

impl Default for KeptPieces {
    fn default() -> KeptPieces {
        KeptPieces {
            by_span: HashMap::new(),
            pieces: 0,
            clock: 0,
            budget: PIECES_KEPT,
        }
    }
}

impl KeptPieces {
    fn get(&mut self, span_id: &str) -> Option<Arc<RequestPieces>> {
        self.clock += 1;
        let (pieces, used) = self.by_span.get_mut(span_id)?;
        *used = self.clock;
        Some(pieces.clone())
    }

    /// Keeps `pieces`, then forgets the least recently used requests
    /// (never the one just kept) while more than the budget is kept.
    fn keep(&mut self, span_id: &str, pieces: Arc<RequestPieces>) {
        self.clock += 1;
        self.pieces += pieces.len();
        if let Some((old, _)) = self
            .by_span
            .insert(span_id.to_string(), (pieces, self.clock))
        {
            self.pieces -= old.len();
        }
        while self.pieces > self.budget && self.by_span.len() > 1 {
            let oldest = self
                .by_span
                .iter()
                .filter(|(id, _)| id.as_str() != span_id)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| id.clone());
            let Some((old, _)) = oldest.and_then(|id| self.by_span.remove(&id)) else {
                break;
            };
            self.pieces -= old.len();
        }
    }
}

impl PieceTable {
    fn new(file: PathBuf) -> PieceTable {
        PieceTable {
            file,
            runs: OnceLock::new(),
        }
    }

    /// The rows of each request in `wanted`.
    fn rows_of(&self, wanted: &[Wanted<'_>]) -> Result<Vec<Range<u64>>, DataError> {
        let mut rows = Vec::new();
        for Wanted {
            span_id,
            rows: given,
            ..
        } in wanted
        {
            match given {
                Some(given) => rows.push(given.range()),
                None => {
                    let runs = self.runs.get_or_init(|| {
                        let mut by_span = RowsBySpan::new();
                        for (span_id, rows) in
                            text_runs(&self.file, "span_id").map_err(|e| e.to_string())?
                        {
                            by_span.entry(span_id).or_default().push(rows);
                        }
                        Ok(by_span)
                    });
                    let runs = runs.as_ref().map_err(|e| DataError::Bad(e.clone()))?;
                    rows.extend(runs.get(*span_id).into_iter().flatten().cloned());
                }
            }
        }
        Ok(rows)
    }

    /// Reads the pieces of the requests in `wanted` into `into` (at each
    /// one's `into`; its queue's if `queue`), joined as they come. A
    /// request's rows are consecutive and in path order (docs/tables.md):
    /// a row of no request wanted, or one out of order, is an error, as
    /// the table and `requests.json` are then not of one analysis.
    fn read(
        &self,
        wanted: &[Wanted<'_>],
        into: &mut [RequestPieces],
        queue: bool,
    ) -> Result<(), DataError> {
        let rows = self.rows_of(wanted)?;
        let slot: HashMap<&str, usize> = wanted.iter().map(|w| (w.span_id, w.into)).collect();
        for w in wanted {
            let count = w.rows.map_or(0, |r| r.count);
            into[w.into]
                .list(queue)
                .reserve_exact(usize::try_from(count).unwrap_or(0));
        }
        let mut last_seq: Vec<Option<i32>> = vec![None; into.len()];
        let mut misplaced = None;
        for_each_row_in(&self.file, &rows, |r: PieceRow| {
            let i = match slot.get(r.span_id.as_str()) {
                Some(&i) if last_seq[i].is_none_or(|last| last < r.seq) => i,
                _ => {
                    misplaced.get_or_insert(r.span_id);
                    return;
                }
            };
            last_seq[i] = Some(r.seq);
            let target = &mut into[i];
            let piece = piece_of(&r, &mut target.strings);
            join_onto(target.list(queue), piece);
        })
        .map_err(store_err)?;
        if let Some(span_id) = misplaced {
            return Err(DataError::Bad(format!(
                "{}: a row of request {span_id} is where requests.json places another \
                 request's rows, or out of its path's order: they are not of one analysis \
                 (run `deepspan analyze` again)",
                self.file.display()
            )));
        }
        Ok(())
    }
}

deepspan_store::table_view! {
    /// What the UI reads of a row of a table in `critical_path`'s columns.
    pub struct PieceRow of deepspan_store::tables::CRITICAL_PATH_COLUMNS {
        span_id: String,
        seq: i32,
        start_ns: i64,
        end_ns: i64,
        state: String,
        tid: Option<i32>,
        comm: Option<String>,
        syscall: Option<String>,
        waiting_in: Option<String>,
        detail: Option<String>,
        blocked_by_request: Option<String>,
        shared: i32,
        lost: bool,
        preempted_by_tid: Option<i32>,
        preempted_by_comm: Option<String>,
        throttled_ns: Option<i64>,
        contended_ns: Option<i64>,
        wakeup_ns: Option<i64>,
    }
}

/// A request whose pieces are to be read from a [`PieceTable`].
struct Wanted<'a> {
    span_id: &'a str,
    /// Where `requests.json` says they are (None in older analyses).
    rows: Option<TableRows>,
    /// Where they go in the reader's output.
    into: usize,
}

/// A row of a table in `critical_path`'s columns as a piece, its strings
/// stored in `strings`.
fn piece_of(r: &PieceRow, strings: &mut Strings) -> Piece {
    Piece {
        start: r.start_ns,
        end: r.end_ns,
        state: strings.intern(Some(&r.state)),
        tid: r.tid,
        comm: strings.intern(r.comm.as_deref()),
        syscall: strings.intern(r.syscall.as_deref()),
        waiting_in: strings.intern(r.waiting_in.as_deref()),
        detail: strings.intern(r.detail.as_deref()),
        blocked_by_request: strings.intern(r.blocked_by_request.as_deref()),
        shared: r.shared,
        lost: r.lost,
        preempted_by_tid: r.preempted_by_tid,
        preempted_by_comm: strings.intern(r.preempted_by_comm.as_deref()),
        throttled_ns: r.throttled_ns.unwrap_or(0),
        contended_ns: r.contended_ns.unwrap_or(0),
        wakeup_ns: r.wakeup_ns.unwrap_or(0),
    }
}

impl RunData {
    /// The pieces of request `span_id` (none for a span id the run does
    /// not hold); read from disk unless kept from an earlier call.
    /// Blocking: call it off the server's async threads.
    pub fn pieces(&self, span_id: &str) -> Result<Arc<RequestPieces>, DataError> {
        Ok(self.pieces_of(&[span_id])?.remove(0))
    }

    /// As [`RunData::pieces`] for several requests, those not kept read
    /// in one pass over each table.
    pub fn pieces_of(&self, span_ids: &[&str]) -> Result<Vec<Arc<RequestPieces>>, DataError> {
        let mut found: Vec<Option<Arc<RequestPieces>>> = {
            let mut kept = self.pieces.kept.lock().unwrap_or_else(|e| e.into_inner());
            span_ids.iter().map(|id| kept.get(id)).collect()
        };
        let missing: Vec<(usize, &RequestEntry)> = span_ids
            .iter()
            .enumerate()
            .filter(|(i, _)| found[*i].is_none())
            .filter_map(|(i, id)| Some((i, self.request(id)?)))
            .collect();
        if !missing.is_empty() {
            let mut read: Vec<RequestPieces> =
                missing.iter().map(|_| RequestPieces::default()).collect();
            let paths: Vec<Wanted> = missing
                .iter()
                .enumerate()
                .map(|(into, (_, r))| Wanted {
                    span_id: &r.span_id,
                    rows: r.critical_path_rows,
                    into,
                })
                .collect();
            self.pieces.critical_path.read(&paths, &mut read, false)?;
            if let Some(table) = &self.pieces.queue_path {
                let queues: Vec<Wanted> = missing
                    .iter()
                    .enumerate()
                    .filter_map(|(into, (_, r))| {
                        Some(Wanted {
                            span_id: &r.span_id,
                            rows: r.queue.as_ref()?.queue_path_rows,
                            into,
                        })
                    })
                    .collect();
                table.read(&queues, &mut read, true)?;
            }
            let mut kept = self.pieces.kept.lock().unwrap_or_else(|e| e.into_inner());
            for ((i, r), pieces) in missing.into_iter().zip(read) {
                let pieces = Arc::new(pieces);
                kept.keep(&r.span_id, pieces.clone());
                found[i] = Some(pieces);
            }
        }
        Ok(found.into_iter().map(Option::unwrap_or_default).collect())
    }
}

/// The records of `placements.json` by span id (none without the file).
fn load_placements(path: &Option<PathBuf>) -> Result<HashMap<String, PlacementRecord>, DataError> {
    let Some(path) = path else {
        return Ok(HashMap::new());
    };
    let doc = read_placements_json(path).map_err(|e| DataError::Bad(e.to_string()))?;
    Ok(doc
        .placements
        .into_iter()
        .map(|p| (p.span_id.clone(), p))
        .collect())
}

/// Adds `p` to the pieces before it in path order, joined to the last
/// one when they differ only in which span of the request the thread
/// worked for: the table tells those apart, the UI does not (as `deepspan
/// report`).
fn join_onto(out: &mut Vec<Piece>, p: Piece) {
    match out.last_mut() {
        Some(last)
            if last.end == p.start
                && last.state == p.state
                && last.tid == p.tid
                && last.syscall == p.syscall
                && last.waiting_in == p.waiting_in
                && last.blocked_by_request == p.blocked_by_request
                && last.detail == p.detail =>
        {
            last.end = p.end;
            last.throttled_ns += p.throttled_ns;
            last.contended_ns += p.contended_ns;
            last.wakeup_ns += p.wakeup_ns;
            last.lost |= p.lost;
            if last.preempted_by_tid.is_none() {
                last.preempted_by_tid = p.preempted_by_tid;
                last.preempted_by_comm = p.preempted_by_comm;
            }
        }
        _ => out.push(p),
    }
}

/// A span as the Gantt chart draws it, on the kernel's monotonic clock.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GanttSpan {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub service: String,
    pub operation: String,
    pub kind: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Monotonic times from the span's own deepspan fields (else mapped
    /// from wall-clock time through the run's clock samples).
    pub exact: bool,
    pub tid: Option<u32>,
    pub depth: u32,
}

/// A trace's spans and its span-level critical path (Jaeger's algorithm).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TraceView {
    pub trace_id: String,
    pub spans: Vec<GanttSpan>,
    /// `(span id, start_ns, end_ns)` on the monotonic clock.
    pub critical_path: Vec<CriticalSection>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct CriticalSection {
    pub span_id: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The run's spans grouped by trace.
pub struct RunSpans {
    traces: HashMap<String, Trace>,
    clock: Option<ClockMap>,
    pub warnings: Vec<String>,
}

impl RunSpans {
    pub fn load(dir: &RunDir) -> Result<RunSpans, DataError> {
        let mut warnings = Vec::new();
        let spans: Vec<Span> = match dir.file(layout::SPANS_DIR) {
            Ok(spans_dir) => {
                let run = spans_dir.parent().unwrap_or(dir.root()).to_path_buf();
                let mut out = Vec::new();
                for s in deepspan_spans::read_run_spans(&run)
                    .map_err(|e| DataError::Bad(format!("cannot read the run's spans: {e}")))?
                {
                    match s {
                        Ok(s) => out.push(s),
                        Err(e) => warnings.push(e.to_string()),
                    }
                }
                out
            }
            Err(_) => Vec::new(),
        };
        let clock = match dir.file(layout::MANIFEST) {
            Ok(_) => ClockMap::from_manifest(dir.root()).ok(),
            Err(_) => None,
        };
        let traces = group_traces(spans)
            .into_iter()
            .map(|t| (t.trace_id.to_string(), t))
            .collect();
        Ok(RunSpans {
            traces,
            clock,
            warnings,
        })
    }

    /// The spans of `trace_id` on the monotonic clock, with the span-level
    /// critical path; None if the run has no such trace.
    pub fn trace(&self, trace_id: &str) -> Option<TraceView> {
        let trace = self.traces.get(trace_id)?;
        let mono = |s: &Span| -> Option<(u64, u64, bool)> {
            if let (Some(a), Some(b)) = (s.sync.mono_start_ns, s.sync.mono_end_ns) {
                return Some((a, b.max(a), true));
            }
            let m = self.clock.as_ref()?.span_mono(s);
            Some((m.start_ns, m.end_ns, m.exact))
        };
        let by_id: HashMap<u64, &Span> = trace.spans.iter().map(|s| (s.span_id.0, s)).collect();
        let depth = |s: &Span| -> u32 {
            let mut d = 0;
            let mut cur = s;
            while let Some(p) = cur.parent_span_id.and_then(|p| by_id.get(&p.0)) {
                d += 1;
                cur = p;
                if d > 1000 {
                    break; // a cycle in bad input
                }
            }
            d
        };
        let mut spans: Vec<GanttSpan> = trace
            .spans
            .iter()
            .filter_map(|s| {
                let (start_ns, end_ns, exact) = mono(s)?;
                Some(GanttSpan {
                    span_id: s.span_id.to_string(),
                    parent_span_id: s.parent_span_id.map(|p| p.to_string()),
                    service: s.service_name().to_string(),
                    operation: s.name.clone(),
                    kind: format!("{:?}", s.kind).to_lowercase(),
                    start_ns,
                    end_ns,
                    exact,
                    tid: s.sync.tid,
                    depth: depth(s),
                })
            })
            .collect();
        spans.sort_by_key(|s| (s.start_ns, s.depth));
        // Sections are in the spans' wall-clock time; each is moved to the
        // monotonic clock by its own span's offset, so exact spans stay exact.
        let critical_path = critical_path(trace, CriticalPathOptions::default())
            .into_iter()
            .filter_map(|sec| {
                let span = by_id.get(&sec.span_id.0)?;
                let (mono_start, _, _) = mono(span)?;
                let shift =
                    |t: u64| (mono_start as i128 + t as i128 - span.start_ns as i128).max(0) as u64;
                Some(CriticalSection {
                    span_id: sec.span_id.to_string(),
                    start_ns: shift(sec.start_ns),
                    end_ns: shift(sec.end_ns),
                })
            })
            .collect();
        Some(TraceView {
            trace_id: trace_id.to_string(),
            spans,
            critical_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(n: usize) -> Arc<RequestPieces> {
        let piece = Piece {
            start: 0,
            end: 1,
            state: NONE,
            tid: None,
            comm: NONE,
            syscall: NONE,
            waiting_in: NONE,
            detail: NONE,
            blocked_by_request: NONE,
            shared: 0,
            lost: false,
            preempted_by_tid: None,
            preempted_by_comm: NONE,
            throttled_ns: 0,
            contended_ns: 0,
            wakeup_ns: 0,
        };
        Arc::new(RequestPieces {
            path: vec![piece; n],
            ..RequestPieces::default()
        })
    }

    #[test]
    fn the_least_recently_used_requests_go_first_and_the_newest_stays() {
        let mut kept = KeptPieces {
            budget: 10,
            ..KeptPieces::default()
        };
        kept.keep("a", pieces(4));
        kept.keep("b", pieces(4));
        assert!(kept.get("a").is_some());
        // Over the budget: b, used least recently, goes.
        kept.keep("c", pieces(4));
        assert!(kept.get("b").is_none());
        assert!(kept.get("a").is_some() && kept.get("c").is_some());
        assert_eq!(kept.pieces, 8);
        // Larger than the budget alone: kept, alone.
        kept.keep("d", pieces(11));
        assert_eq!(kept.by_span.len(), 1);
        assert_eq!(kept.get("d").map(|p| p.path.len()), Some(11));
        assert_eq!(kept.pieces, 11);
        // Kept again under the same id: counted once.
        kept.keep("d", pieces(3));
        assert_eq!(kept.pieces, 3);
    }
}
