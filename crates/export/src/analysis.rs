//! What export needs of a run's analysis (`RUN/analysis/`): the requests
//! with their diagnoses (`requests.json`), their critical-path pieces
//! (`critical_path.parquet`), the long system calls of their threads
//! (`syscalls.parquet`) and the containers of their processes
//! (`containers.parquet`), each read as its typed rows
//! (`deepspan_store::rows`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use deepspan_model::container::Container;
use deepspan_run::analysis::{CONTAINERS, CRITICAL_PATH, SYSCALLS};
use deepspan_run::Run;
use deepspan_spans::{SpanId, TraceId};
use deepspan_store::json::RequestEntry;
use deepspan_store::kept::{KeepColumns, KeptAnalysis, KeptTable};
use deepspan_store::rows::{for_each_row, TableRow};
use deepspan_store::tables::{ContainerRow, CriticalPathRow, SYSCALLS_COLUMNS};

use crate::Error;

/// One request of the analysis.
#[derive(Clone, Debug)]
pub struct Request {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub service: String,
    pub operation: String,
    /// CLOCK_MONOTONIC ns of the recording host.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The first thread the request ran on.
    pub tid: Option<i64>,
    /// How the request was placed on the kernel trace (`exact`, `clock_mapped`, `none`).
    pub sync: String,
    pub lost_events: u64,
    pub truncated: bool,
    pub anomalous: bool,
    pub baseline_ns: Option<u64>,
    /// The label of the largest cause (`[8123/pricing] PREEMPTED (throttled)`).
    pub top_cause: Option<String>,
    /// As in requests.json.
    pub diagnosis: Option<deepspan_store::json::DiagnosisDoc>,
    /// In path order.
    pub pieces: Vec<Piece>,
    /// Its time queued before the span started, when its arrival is known.
    pub queue: Option<Queue>,
}

/// A request's time queued at its host before its span started.
#[derive(Clone, Debug, PartialEq)]
pub struct Queue {
    /// CLOCK_MONOTONIC ns of the recording host, before the request's start.
    pub arrival_ns: u64,
    /// `client_send` or `server_receive`.
    pub arrival_by: String,
    /// The label of its largest cause (`queued behind 3 requests of …`).
    pub cause: Option<String>,
    /// The requests it was queued behind, most time first.
    pub behind: Vec<(TraceId, SpanId)>,
}

impl Request {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// `[service] operation`.
    pub fn label(&self) -> String {
        format!("[{}] {}", self.service, self.operation)
    }
}

/// One row of `critical_path`.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub start_ns: u64,
    pub end_ns: u64,
    pub state: String,
    pub tid: Option<i64>,
    pub comm: Option<String>,
    pub syscall: Option<String>,
    pub waiting_in: Option<String>,
    pub detail: Option<String>,
    /// The request this piece worked for, when not the piece's own.
    pub blocked_by: Option<(TraceId, SpanId)>,
    pub lost: bool,
    pub preempted_by: Option<(i64, Option<String>)>,
    pub throttled_ns: u64,
    pub contended_ns: u64,
    pub wakeup_ns: u64,
}

impl Piece {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// One system call long enough to be exported.
#[derive(Clone, Debug)]
pub struct Syscall {
    pub tid: i64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub nr: i64,
    pub name: Option<String>,
    pub ret: Option<i64>,
}

deepspan_store::table_view! {
    /// What export reads of a system call (the table has many rows: only
    /// these columns are decoded).
    pub struct SyscallOfThread of SYSCALLS_COLUMNS {
        tid: i32,
        pid: Option<i32>,
        start_ns: i64,
        end_ns: i64,
        nr: i32,
        name: Option<String>,
        ret: Option<i64>,
    }
}

/// The analysis of a run, as export uses it.
#[derive(Debug, Default)]
pub struct RunAnalysis {
    /// Slowest first, as in requests.json.
    pub requests: Vec<Request>,
    /// Per thread, its system calls of at least the minimum length, by start.
    pub syscalls: HashMap<i64, Vec<Syscall>>,
    /// Thread → process, from the system-call table.
    pub pids: HashMap<i64, i64>,
    /// Process → its container and pod, for those that ran in one.
    pub containers: HashMap<i64, Container>,
}

/// Nanoseconds as the tables hold them (signed).
fn ns(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn bad(path: &Path, what: String) -> Error {
    Error::Analysis {
        path: path.to_path_buf(),
        what,
    }
}

/// The columns export reads of the analysis tables: what an analysis
/// keeps in memory for [`from_kept`] (`AnalyzeOptions::keep`).
pub const KEEP: KeepColumns = KeepColumns {
    critical_path: <CriticalPathRow as TableRow>::COLUMNS,
    syscalls: <SyscallOfThread as TableRow>::COLUMNS,
};

/// Reads `RUN/analysis/`. System calls shorter than `min_syscall_ns` are
/// not kept (nor those of threads no request started on).
pub fn read(run_dir: &Path, min_syscall_ns: u64) -> Result<RunAnalysis, Error> {
    let run = Run::new(run_dir);
    let dir = run.analysis_dir();
    let json_path = run.requests_json();
    if !json_path.is_file() {
        return Err(Error::NoAnalysis {
            run: run_dir.to_path_buf(),
        });
    }
    let doc = deepspan_store::json::read_requests_json(run_dir)
        .map_err(|e| bad(&json_path, e.to_string()))?;
    let mut containers = HashMap::new();
    // An analysis made before containers were named has no table.
    Rows::File(dir.join(CONTAINERS)).for_each(|row: ContainerRow| {
        containers.insert(i64::from(row.pid), row.container());
    })?;
    let mut analysis = assemble(
        doc.requests,
        &json_path,
        Rows::File(dir.join(CRITICAL_PATH)),
        Rows::File(dir.join(SYSCALLS)),
        min_syscall_ns,
    )?;
    analysis.containers = containers;
    Ok(analysis)
}

/// [`read`] of an analysis kept in memory as it was written to `run_dir`
/// (`AnalyzeOptions::keep` with [`KEEP`]): the same rows, not decoded
/// again.
pub fn from_kept(
    run_dir: &Path,
    kept: KeptAnalysis,
    min_syscall_ns: u64,
) -> Result<RunAnalysis, Error> {
    let KeptAnalysis {
        requests,
        critical_path,
        syscalls,
        containers,
    } = kept;
    let mut analysis = assemble(
        requests,
        &Run::new(run_dir).requests_json(),
        Rows::Kept(&critical_path),
        Rows::Kept(&syscalls),
        min_syscall_ns,
    )?;
    analysis.containers = containers
        .iter()
        .map(|(pid, c)| (i64::from(pid), (**c).clone()))
        .collect();
    Ok(analysis)
}

/// Where a table's rows come from.
enum Rows<'a> {
    /// A table file; none: no rows.
    File(PathBuf),
    Kept(&'a KeptTable),
}

impl Rows<'_> {
    fn path(&self) -> &Path {
        match self {
            Rows::File(path) => path,
            Rows::Kept(table) => table.path(),
        }
    }

    fn for_each<R: TableRow>(&self, each: impl FnMut(R)) -> Result<(), Error> {
        match self {
            Rows::File(path) if !path.is_file() => Ok(()),
            Rows::File(path) => for_each_row(path, each),
            Rows::Kept(table) => table.for_each_row(each),
        }
        .map_err(Error::Store)
    }
}

/// The analysis from `requests.json`'s requests (read from
/// `json_path`) and the rows of the `critical_path` and `syscalls` tables.
fn assemble(
    entries: Vec<RequestEntry>,
    json_path: &Path,
    critical_path: Rows,
    syscall_rows: Rows,
    min_syscall_ns: u64,
) -> Result<RunAnalysis, Error> {
    let mut requests = Vec::with_capacity(entries.len());
    // The span ids each request was queued behind, resolved to requests
    // (of any trace) once all are read.
    let mut queued_behind: Vec<Vec<SpanId>> = Vec::with_capacity(entries.len());
    for (i, r) in entries.into_iter().enumerate() {
        let trace_id = TraceId::from_hex(&r.trace_id)
            .ok_or_else(|| bad(json_path, format!("requests[{i}].trace_id is not hex")))?;
        let span_id = SpanId::from_hex(&r.span_id)
            .ok_or_else(|| bad(json_path, format!("requests[{i}].span_id is not hex")))?;
        requests.push(Request {
            trace_id,
            span_id,
            top_cause: r.causes.first().map(|c| c.label.clone()),
            service: r.service,
            operation: r.operation,
            start_ns: r.start_ns,
            end_ns: r.end_ns,
            tid: r.tid.map(i64::from),
            sync: r.sync.into_owned(),
            lost_events: r.lost_events,
            truncated: r.truncated,
            anomalous: r.anomalous,
            baseline_ns: r.baseline_ns,
            diagnosis: r.diagnosis,
            pieces: Vec::new(),
            queue: r.queue.as_ref().map(|q| Queue {
                arrival_ns: q.arrival_ns,
                arrival_by: q.arrival_by.clone(),
                cause: q.cause_groups.first().map(|g| g.label.clone()),
                behind: Vec::new(),
            }),
        });
        queued_behind.push(
            r.queue
                .iter()
                .flat_map(|q| &q.cause_groups)
                .flat_map(|g| &g.blocked_by_requests)
                .filter_map(|id| SpanId::from_hex(id))
                .collect(),
        );
    }
    let trace_of: HashMap<SpanId, TraceId> =
        requests.iter().map(|r| (r.span_id, r.trace_id)).collect();
    for (request, behind) in requests.iter_mut().zip(queued_behind) {
        if let Some(q) = request.queue.as_mut() {
            q.behind = behind
                .into_iter()
                .filter_map(|span| Some((*trace_of.get(&span)?, span)))
                .collect();
        }
    }

    let index: HashMap<(TraceId, SpanId), usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.trace_id, r.span_id), i))
        .collect();
    let mut ordered: Vec<Vec<(i64, Piece)>> = vec![Vec::new(); requests.len()];
    let mut problem = None;
    critical_path.for_each(|row: CriticalPathRow| {
        let ids = (
            TraceId::from_hex(&row.trace_id),
            SpanId::from_hex(&row.span_id),
        );
        let (Some(trace_id), Some(span_id)) = ids else {
            problem.get_or_insert_with(|| "a row without hex trace_id/span_id".to_string());
            return;
        };
        let Some(&i) = index.get(&(trace_id, span_id)) else {
            return;
        };
        let blocked_by = row
            .blocked_by_request
            .as_deref()
            .and_then(SpanId::from_hex)
            .map(|span| {
                let trace = row
                    .blocked_by_trace_id
                    .as_deref()
                    .and_then(TraceId::from_hex)
                    .unwrap_or(trace_id);
                (trace, span)
            });
        let piece = Piece {
            start_ns: ns(row.start_ns),
            end_ns: ns(row.end_ns),
            state: row.state,
            tid: row.tid.map(i64::from),
            comm: row.comm,
            syscall: row.syscall,
            waiting_in: row.waiting_in,
            detail: row.detail,
            blocked_by,
            lost: row.lost,
            preempted_by: row
                .preempted_by_tid
                .map(|t| (i64::from(t), row.preempted_by_comm)),
            throttled_ns: row.throttled_ns.map_or(0, ns),
            contended_ns: row.contended_ns.map_or(0, ns),
            wakeup_ns: row.wakeup_ns.map_or(0, ns),
        };
        ordered[i].push((i64::from(row.seq), piece));
    })?;
    if let Some(p) = problem {
        return Err(bad(critical_path.path(), p));
    }
    for (request, mut pieces) in requests.iter_mut().zip(ordered) {
        pieces.sort_by_key(|(seq, _)| *seq);
        request.pieces = pieces.into_iter().map(|(_, p)| p).collect();
    }

    let home_threads: HashSet<i64> = requests.iter().filter_map(|r| r.tid).collect();
    let mut syscalls: HashMap<i64, Vec<Syscall>> = HashMap::new();
    let mut pids = HashMap::new();
    syscall_rows.for_each(|row: SyscallOfThread| {
        let tid = i64::from(row.tid);
        if let Some(pid) = row.pid {
            pids.entry(tid).or_insert(i64::from(pid));
        }
        if row.end_ns.saturating_sub(row.start_ns) >= min_syscall_ns as i64
            && home_threads.contains(&tid)
        {
            syscalls.entry(tid).or_default().push(Syscall {
                tid,
                start_ns: ns(row.start_ns),
                end_ns: ns(row.end_ns),
                nr: i64::from(row.nr),
                name: row.name,
                ret: row.ret,
            });
        }
    })?;
    for list in syscalls.values_mut() {
        list.sort_by_key(|s| s.start_ns);
    }
    Ok(RunAnalysis {
        requests,
        syscalls,
        pids,
        containers: HashMap::new(),
    })
}
