//! What export needs of a run's analysis (`RUN/analysis/`): the requests
//! with their diagnoses (`requests.json`), their critical-path pieces
//! (`critical_path.parquet`) and the long system calls of their threads
//! (`syscalls.parquet`). Columns are found by name, so tables that gained
//! columns still read.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use deepspan_run::analysis::{CRITICAL_PATH, SYSCALLS};
use deepspan_run::Run;
use deepspan_spans::{SpanId, TraceId};
use deepspan_store::table::{read_rows, Cell};
use parquet::record::Field;

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

/// The analysis of a run, as export uses it.
#[derive(Debug, Default)]
pub struct RunAnalysis {
    /// Slowest first, as in requests.json.
    pub requests: Vec<Request>,
    /// Per thread, its system calls of at least the minimum length, by start.
    pub syscalls: HashMap<i64, Vec<Syscall>>,
    /// Thread → process, from the system-call table.
    pub pids: HashMap<i64, i64>,
}

fn get<'a>(row: &'a [(String, Cell)], name: &str) -> &'a Cell {
    row.iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c)
        .unwrap_or(&Cell::Null)
}

fn text(row: &[(String, Cell)], name: &str) -> Option<String> {
    get(row, name).as_str().map(str::to_string)
}

fn uint(row: &[(String, Cell)], name: &str) -> u64 {
    get(row, name).as_u64().unwrap_or(0)
}

fn int(f: &Field) -> Option<i64> {
    match f {
        Field::Int(v) => Some(i64::from(*v)),
        Field::Long(v) => Some(*v),
        Field::UInt(v) => Some(i64::from(*v)),
        Field::ULong(v) => i64::try_from(*v).ok(),
        _ => None,
    }
}

/// Calls `each` with the values of `columns` (in that order) of every row;
/// only those columns are decoded. A column the file lacks is an error.
fn read_columns(
    path: &Path,
    columns: &[&str],
    mut each: impl FnMut(&[Field]),
) -> Result<(), Error> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let fail = |what: String| bad(path, what);
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| fail(e.to_string()))?;
    let schema = reader.metadata().file_metadata().schema();
    let mut fields = Vec::with_capacity(columns.len());
    for name in columns {
        let field = schema
            .get_fields()
            .iter()
            .find(|f| f.name() == *name)
            .ok_or_else(|| fail(format!("no column {name:?}")))?;
        fields.push(field.clone());
    }
    let projection = parquet::schema::types::Type::group_type_builder(schema.name())
        .with_fields(fields)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| fail(e.to_string()))?;
    let mut values = Vec::with_capacity(columns.len());
    for row in rows {
        let row = row.map_err(|e| fail(e.to_string()))?;
        values.clear();
        values.extend(row.into_columns().into_iter().map(|(_, f)| f));
        each(&values);
    }
    Ok(())
}

fn bad(path: &Path, what: String) -> Error {
    Error::Analysis {
        path: path.to_path_buf(),
        what,
    }
}

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
    let mut requests = Vec::with_capacity(doc.requests.len());
    for (i, r) in doc.requests.into_iter().enumerate() {
        let trace_id = TraceId::from_hex(&r.trace_id)
            .ok_or_else(|| bad(&json_path, format!("requests[{i}].trace_id is not hex")))?;
        let span_id = SpanId::from_hex(&r.span_id)
            .ok_or_else(|| bad(&json_path, format!("requests[{i}].span_id is not hex")))?;
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
        });
    }

    let index: HashMap<(TraceId, SpanId), usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.trace_id, r.span_id), i))
        .collect();
    let path_file = dir.join(CRITICAL_PATH);
    let mut ordered: Vec<Vec<(i64, Piece)>> = vec![Vec::new(); requests.len()];
    if path_file.is_file() {
        let mut problem = None;
        read_rows(&path_file, |row| {
            let ids = (
                text(row, "trace_id").and_then(|t| TraceId::from_hex(&t)),
                text(row, "span_id").and_then(|s| SpanId::from_hex(&s)),
            );
            let (Some(trace_id), Some(span_id)) = ids else {
                problem.get_or_insert_with(|| "a row without hex trace_id/span_id".to_string());
                return false;
            };
            let Some(&i) = index.get(&(trace_id, span_id)) else {
                return false;
            };
            let blocked_by = text(row, "blocked_by_request")
                .and_then(|s| SpanId::from_hex(&s))
                .map(|span| {
                    let trace = text(row, "blocked_by_trace_id")
                        .and_then(|t| TraceId::from_hex(&t))
                        .unwrap_or(trace_id);
                    (trace, span)
                });
            let piece = Piece {
                start_ns: uint(row, "start_ns"),
                end_ns: uint(row, "end_ns"),
                state: text(row, "state").unwrap_or_else(|| "UNKNOWN".into()),
                tid: get(row, "tid").as_i64(),
                comm: text(row, "comm"),
                syscall: text(row, "syscall"),
                waiting_in: text(row, "waiting_in"),
                detail: text(row, "detail"),
                blocked_by,
                lost: get(row, "lost").as_bool().unwrap_or(false),
                preempted_by: get(row, "preempted_by_tid")
                    .as_i64()
                    .map(|t| (t, text(row, "preempted_by_comm"))),
                throttled_ns: uint(row, "throttled_ns"),
                contended_ns: uint(row, "contended_ns"),
                wakeup_ns: uint(row, "wakeup_ns"),
            };
            ordered[i].push((get(row, "seq").as_i64().unwrap_or(0), piece));
            false
        })
        .map_err(Error::Store)?;
        if let Some(p) = problem {
            return Err(bad(&path_file, p));
        }
    }
    for (request, mut pieces) in requests.iter_mut().zip(ordered) {
        pieces.sort_by_key(|(seq, _)| *seq);
        request.pieces = pieces.into_iter().map(|(_, p)| p).collect();
    }

    let home_threads: HashSet<i64> = requests.iter().filter_map(|r| r.tid).collect();
    let mut syscalls: HashMap<i64, Vec<Syscall>> = HashMap::new();
    let mut pids = HashMap::new();
    let syscalls_file = dir.join(SYSCALLS);
    if syscalls_file.is_file() {
        let columns = ["tid", "pid", "start_ns", "end_ns", "nr", "name", "ret"];
        read_columns(&syscalls_file, &columns, |row| {
            let [tid, pid, start_ns, end_ns, nr, name, ret] = row else {
                return;
            };
            let Some(tid) = int(tid) else {
                return;
            };
            if let Some(pid) = int(pid) {
                pids.entry(tid).or_insert(pid);
            }
            let (start_ns, end_ns) = (int(start_ns).unwrap_or(0), int(end_ns).unwrap_or(0));
            if end_ns.saturating_sub(start_ns) >= min_syscall_ns as i64
                && home_threads.contains(&tid)
            {
                syscalls.entry(tid).or_default().push(Syscall {
                    tid,
                    start_ns: start_ns.max(0) as u64,
                    end_ns: end_ns.max(0) as u64,
                    nr: int(nr).unwrap_or(-1),
                    name: match name {
                        Field::Str(s) => Some(s.clone()),
                        _ => None,
                    },
                    ret: int(ret),
                });
            }
        })?;
    }
    for list in syscalls.values_mut() {
        list.sort_by_key(|s| s.start_ns);
    }
    Ok(RunAnalysis {
        requests,
        syscalls,
        pids,
    })
}
