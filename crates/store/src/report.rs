//! One request read back from `RUN/analysis/`: what `deepspan report`
//! shows. The serialized form is the report's JSON (fields fixed by the
//! CLI's contract); the `#[serde(skip)]` fields feed the text form only.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::Path;

use deepspan_analysis::Cause;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::diagnosis::{DiagnosisDoc, RootCauseDoc};
use crate::rows::{for_each_row_in, read_table};
use crate::tables::{
    CriticalPathRow, DiagnosisRow, RequestRow, RequestSummaryRow, RequestSyscallRow,
};
use crate::Error;
use deepspan_run::analysis::{
    CRITICAL_PATH, DIAGNOSES, QUEUE_PATH, REQUESTS, REQUEST_SUMMARY, REQUEST_SYSCALLS,
};
use deepspan_run::Run;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub request: ReportRequest,
    pub critical_path: Vec<ReportPiece>,
    pub summary: Vec<ReportSummaryRow>,
    pub lost_events: u64,
    /// The diagnosis object of the contract (`cause`, `headline`,
    /// `evidence`, `culprits`, `root_cause` from version 2 tables on), as
    /// in `requests.json`; null without a kernel path.
    pub diagnosis: Option<DiagnosisDoc>,
    /// Its time queued at its host before its span started; null when its
    /// arrival is not known (and in analyses made before queues).
    pub queue: Option<ReportQueue>,
    #[serde(skip)]
    pub details: ReportDetails,
}

/// A request's time queued before its span started.
#[derive(Clone, Debug, Serialize)]
pub struct ReportQueue {
    /// When the request reached its host.
    pub arrival_ns: u64,
    /// `client_send` or `server_receive`.
    pub arrival_by: String,
    /// From the arrival to the span's start.
    pub ns: u64,
    /// Its largest cause, `queued behind 3 requests of [node] GET /slow`.
    pub cause: Option<String>,
    /// Its path, `[arrival, start)` (empty without a kernel path).
    pub critical_path: Vec<ReportPiece>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReportRequest {
    pub trace_id: String,
    pub span_id: String,
    pub service: String,
    pub operation: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReportPiece {
    pub start_ns: u64,
    pub end_ns: u64,
    pub state: String,
    pub tid: Option<i64>,
    pub comm: Option<String>,
    pub syscall: Option<String>,
    pub blocked_by_request: Option<String>,
    #[serde(skip)]
    pub detail: Option<String>,
    #[serde(skip)]
    pub preempted_by: Option<(i64, Option<String>)>,
    #[serde(skip)]
    pub throttled_ns: u64,
    #[serde(skip)]
    pub contended_ns: u64,
    #[serde(skip)]
    pub wakeup_ns: u64,
    #[serde(skip)]
    pub lost: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReportSummaryRow {
    pub state: String,
    pub tid: Option<i64>,
    pub comm: Option<String>,
    pub blocked_by_request: Option<String>,
    pub ns: u64,
    #[serde(skip)]
    pub throttled_ns: u64,
    #[serde(skip)]
    pub contended_ns: u64,
    #[serde(skip)]
    pub wakeup_ns: u64,
}

/// What the text report adds to the JSON.
#[derive(Clone, Debug, Default)]
pub struct ReportDetails {
    pub sync: String,
    pub truncated: bool,
    /// `(system call, ns)` on the path, largest first.
    pub syscalls: Vec<(String, u64)>,
    /// `[service] operation` of the requests this one was blocked by.
    pub blockers: HashMap<String, String>,
    /// From the `diagnoses` table (absent in analyses made before it).
    pub anomalous: bool,
    pub baseline_ns: Option<u64>,
}

/// Nanoseconds as the tables hold them (signed), as reports show them.
fn ns(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Parses an id as hex, without caring for leading zeros.
fn hex(s: &str) -> Option<u128> {
    let s = s.trim().trim_start_matches("0x");
    if s.is_empty() || s.len() > 32 {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// Reads the analysis of one request. `id` is a span id (16 hex digits or
/// fewer) or a trace id (32 or fewer; for a trace, its root request, or
/// its longest one when no request is a root).
pub fn read_report(run_dir: &Path, id: &str) -> Result<Report, Error> {
    let dir = Run::new(run_dir).analysis_dir();
    let requests_path = dir.join(REQUESTS);
    if !requests_path.is_file() {
        return Err(Error::NotFound {
            what: format!(
                "{} has no analysis (no {}): run `deepspan analyze {}` first",
                run_dir.display(),
                requests_path.display(),
                run_dir.display()
            ),
        });
    }
    let wanted = hex(id).ok_or_else(|| Error::NotFound {
        what: format!("{id:?} is not a span id or trace id (hex digits)"),
    })?;
    let requests: Vec<RequestRow> = read_table(&requests_path, |_| true)?;
    let is_wanted = |id: &str| hex(id) == Some(wanted);
    let chosen = match requests.iter().find(|r| is_wanted(&r.span_id)) {
        Some(r) => r,
        None => {
            let mut in_trace: Vec<&RequestRow> =
                requests.iter().filter(|r| is_wanted(&r.trace_id)).collect();
            // The root first, then the longest.
            in_trace
                .sort_by_key(|r| (r.parent_span_id.is_some(), std::cmp::Reverse(r.duration_ns)));
            in_trace.first().copied().ok_or_else(|| Error::NotFound {
                what: format!(
                    "no request with span id or trace id {id} in {} ({} requests)",
                    requests_path.display(),
                    requests.len()
                ),
            })?
        }
    };
    let (trace_id, span_id) = (chosen.trace_id.as_str(), chosen.span_id.as_str());
    let operations: HashMap<&str, String> = requests
        .iter()
        .map(|r| {
            (
                r.span_id.as_str(),
                format!("[{}] {}", r.service, r.operation),
            )
        })
        .collect();

    let critical_path = joined_pieces(read_path_rows(
        &dir.join(CRITICAL_PATH),
        &[chosen],
        |r: &CriticalPathRow| r.span_id == span_id && r.trace_id == trace_id,
    )?);
    let summary: Vec<ReportSummaryRow> =
        read_table(&dir.join(REQUEST_SUMMARY), |r: &RequestSummaryRow| {
            r.span_id == span_id && r.trace_id == trace_id
        })?
        .into_iter()
        .map(|r| ReportSummaryRow {
            state: r.state,
            tid: r.tid.map(i64::from),
            comm: r.comm,
            blocked_by_request: r.blocked_by_request,
            ns: ns(r.ns),
            throttled_ns: ns(r.throttled_ns),
            contended_ns: ns(r.contended_ns),
            wakeup_ns: ns(r.wakeup_ns),
        })
        .collect();
    let syscalls = read_table(&dir.join(REQUEST_SYSCALLS), |r: &RequestSyscallRow| {
        r.span_id == span_id && r.trace_id == trace_id
    })?
    .into_iter()
    .map(|r| (r.syscall, ns(r.ns)))
    .collect();
    let (mut diagnosis, mut anomalous, mut baseline_ns) = (None, false, None);
    let diagnoses_path = dir.join(DIAGNOSES);
    if diagnoses_path.is_file() {
        let rows = read_table(&diagnoses_path, |r: &DiagnosisRow| {
            r.span_id == span_id && r.trace_id == trace_id
        })?;
        if let Some(row) = rows.into_iter().next() {
            anomalous = row.anomalous;
            baseline_ns = row.baseline_ns.and_then(|v| u64::try_from(v).ok());
            diagnosis = diagnosis_doc(row, &diagnoses_path)?;
        }
    }
    let queue = match (chosen.arrival_ns, &chosen.arrival_by) {
        (Some(arrival), Some(by)) => {
            let path = dir.join(QUEUE_PATH);
            let pieces = if path.is_file() {
                read_table(&path, |r: &CriticalPathRow| {
                    r.span_id == span_id && r.trace_id == trace_id
                })?
            } else {
                Vec::new()
            };
            Some(ReportQueue {
                arrival_ns: ns(arrival),
                arrival_by: by.clone(),
                ns: ns(chosen.queue_ns),
                cause: chosen.queue_cause.clone(),
                critical_path: joined_pieces(pieces),
            })
        }
        _ => None,
    };
    let blockers = summary
        .iter()
        .filter_map(|s| s.blocked_by_request.clone())
        .filter_map(|b| operations.get(b.as_str()).map(|op| (b, op.clone())))
        .collect();
    Ok(Report {
        request: report_request(chosen),
        critical_path,
        summary,
        lost_events: ns(chosen.lost_events),
        diagnosis,
        queue,
        details: ReportDetails {
            anomalous,
            baseline_ns,
            sync: chosen.sync.clone(),
            truncated: chosen.truncated,
            syscalls,
            blockers,
        },
    })
}

/// The diagnosis of a `diagnoses` row, as in `requests.json`; `None` for a
/// request without a kernel path (no cause).
fn diagnosis_doc(row: DiagnosisRow, path: &Path) -> Result<Option<DiagnosisDoc>, Error> {
    let Some(cause) = row.cause else {
        return Ok(None);
    };
    let cause_of = |text: String| {
        Cause::from_name(&text).ok_or_else(|| Error::Schema {
            path: path.to_path_buf(),
            what: format!("unknown cause {text:?}"),
        })
    };
    // Version 2 tables: the root cause.
    let root_cause = match row.root_cause {
        Some(root) => Some(RootCauseDoc {
            cause: cause_of(root)?,
            chain: row.root_chain,
            culprits: parse_json_column(row.root_culprits_json, path)?,
            evidence: parse_json_column(row.root_evidence_json, path)?,
            headline: row.root_headline.unwrap_or_default(),
        }),
        None => None,
    };
    Ok(Some(DiagnosisDoc {
        cause: cause_of(cause)?,
        culprits: parse_json_column(row.culprits_json, path)?,
        evidence: parse_json_column(row.evidence_json, path)?,
        headline: row.headline.unwrap_or_default(),
        root_cause,
    }))
}

/// A JSON text column of the `diagnoses` table read as its type; empty
/// when null.
fn parse_json_column<T: DeserializeOwned + Default>(
    text: Option<String>,
    path: &Path,
) -> Result<T, Error> {
    match text {
        Some(text) => serde_json::from_str(&text).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            at: None,
            source,
        }),
        None => Ok(T::default()),
    }
}

fn report_request(row: &RequestRow) -> ReportRequest {
    ReportRequest {
        trace_id: row.trace_id.clone(),
        span_id: row.span_id.clone(),
        service: row.service.clone(),
        operation: row.operation.clone(),
        start_ns: ns(row.start_ns),
        end_ns: ns(row.end_ns),
    }
}

/// One request's rows of the critical-path table, in path order, as a
/// report's pieces. The tables tell apart pieces that differ only in which
/// span of the request the thread worked for; a report does not.
/// The rows of `critical_path` (at `path`) for which `keep` is true, of
/// `requests`: only their rows are read when the `requests` table says
/// where they are (layout 3), else every row. A row there that `keep`
/// refuses is an error: the two tables are not of one analysis.
fn read_path_rows(
    path: &Path,
    requests: &[&RequestRow],
    mut keep: impl FnMut(&CriticalPathRow) -> bool,
) -> Result<Vec<CriticalPathRow>, Error> {
    let ranges: Option<Vec<Range<u64>>> = requests
        .iter()
        .map(|r| {
            let first = u64::try_from(r.critical_path_first_row?).ok()?;
            Some(first..first.saturating_add(u64::try_from(r.pieces).ok()?))
        })
        .collect();
    let Some(ranges) = ranges else {
        return read_table(path, keep);
    };
    let mut kept = Vec::new();
    let mut stray = None;
    for_each_row_in(path, &ranges, |row: CriticalPathRow| {
        if keep(&row) {
            kept.push(row);
        } else {
            stray.get_or_insert(row.span_id);
        }
    })?;
    match stray {
        None => Ok(kept),
        Some(span_id) => Err(Error::Schema {
            path: path.to_path_buf(),
            what: format!(
                "a row of request {span_id} is where the requests table places another \
                 request's rows: the tables are not of one analysis (run `deepspan analyze` again)"
            ),
        }),
    }
}

fn joined_pieces(mut rows: Vec<CriticalPathRow>) -> Vec<ReportPiece> {
    rows.sort_by_key(|r| r.seq);
    let mut critical_path: Vec<ReportPiece> = Vec::with_capacity(rows.len());
    let read = rows.into_iter().map(|r| ReportPiece {
        start_ns: ns(r.start_ns),
        end_ns: ns(r.end_ns),
        state: r.state,
        tid: r.tid.map(i64::from),
        comm: r.comm,
        syscall: r.syscall,
        blocked_by_request: r.blocked_by_request,
        detail: r.detail,
        preempted_by: r
            .preempted_by_tid
            .map(|t| (i64::from(t), r.preempted_by_comm)),
        throttled_ns: r.throttled_ns.map_or(0, ns),
        contended_ns: r.contended_ns.map_or(0, ns),
        wakeup_ns: r.wakeup_ns.map_or(0, ns),
        lost: r.lost,
    });
    for p in read {
        match critical_path.last_mut() {
            Some(last)
                if last.end_ns == p.start_ns
                    && last.state == p.state
                    && last.tid == p.tid
                    && last.comm == p.comm
                    && last.syscall == p.syscall
                    && last.blocked_by_request == p.blocked_by_request
                    && last.detail == p.detail =>
            {
                last.end_ns = p.end_ns;
                last.throttled_ns += p.throttled_ns;
                last.contended_ns += p.contended_ns;
                last.wakeup_ns += p.wakeup_ns;
                last.lost |= p.lost;
                if last.preempted_by.is_none() {
                    last.preempted_by = p.preempted_by;
                }
            }
            _ => critical_path.push(p),
        }
    }
    critical_path
}

/// The kernel critical paths of many requests (by span id, as in
/// requests.json), reading each table once where [`read_report`] per
/// request would read them all every time. In `span_ids` order; a span id
/// with no analysed request is an error.
pub fn read_critical_paths(
    run_dir: &Path,
    span_ids: &[String],
) -> Result<Vec<(ReportRequest, Vec<ReportPiece>)>, Error> {
    let dir = Run::new(run_dir).analysis_dir();
    let wanted: HashSet<&str> = span_ids.iter().map(String::as_str).collect();
    let requests = read_table(&dir.join(REQUESTS), |r: &RequestRow| {
        wanted.contains(r.span_id.as_str())
    })?;
    let mut rows_of: HashMap<(String, String), Vec<CriticalPathRow>> = HashMap::new();
    let chosen: Vec<&RequestRow> = requests.iter().collect();
    let in_path = read_path_rows(&dir.join(CRITICAL_PATH), &chosen, |r: &CriticalPathRow| {
        wanted.contains(r.span_id.as_str())
    })?;
    for row in in_path {
        let key = (row.trace_id.clone(), row.span_id.clone());
        rows_of.entry(key).or_default().push(row);
    }
    span_ids
        .iter()
        .map(|id| {
            let row =
                requests
                    .iter()
                    .find(|r| r.span_id == *id)
                    .ok_or_else(|| Error::NotFound {
                        what: format!("no analysed request with span id {id} in {}", dir.display()),
                    })?;
            let request = report_request(row);
            let rows = rows_of
                .remove(&(request.trace_id.clone(), request.span_id.clone()))
                .unwrap_or_default();
            Ok((request, joined_pieces(rows)))
        })
        .collect()
}
