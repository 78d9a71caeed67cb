//! One request read back from `RUN/analysis/`: what `deepspan report`
//! shows. The serialized form is the report's JSON (fields fixed by the
//! CLI's contract); the `#[serde(skip)]` fields feed the text form only.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use deepspan_analysis::Cause;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::diagnosis::{DiagnosisDoc, RootCauseDoc};
use crate::table::{read_rows, Cell};
use crate::Error;
use deepspan_run::analysis::{
    CRITICAL_PATH, DIAGNOSES, REQUESTS, REQUEST_SUMMARY, REQUEST_SYSCALLS,
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
    #[serde(skip)]
    pub details: ReportDetails,
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

fn get<'a>(row: &'a [(String, Cell)], name: &str) -> &'a Cell {
    row.iter()
        .find(|(n, _)| n == name)
        .map(|(_, c)| c)
        .unwrap_or(&Cell::Null)
}

fn string(row: &[(String, Cell)], name: &str) -> Option<String> {
    get(row, name).as_str().map(str::to_string)
}

fn uint(row: &[(String, Cell)], name: &str) -> u64 {
    get(row, name).as_u64().unwrap_or(0)
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
    let requests = read_rows(&requests_path, |_| true)?;
    let by_span: Vec<&Vec<(String, Cell)>> = requests
        .iter()
        .filter(|r| string(r, "span_id").and_then(|s| hex(&s)) == Some(wanted))
        .collect();
    let chosen = if let Some(r) = by_span.first() {
        *r
    } else {
        let mut in_trace: Vec<&Vec<(String, Cell)>> = requests
            .iter()
            .filter(|r| string(r, "trace_id").and_then(|s| hex(&s)) == Some(wanted))
            .collect();
        // The root first, then the longest.
        in_trace.sort_by_key(|r| {
            (
                !matches!(get(r, "parent_span_id"), Cell::Null),
                std::cmp::Reverse(uint(r, "duration_ns")),
            )
        });
        *in_trace.first().ok_or_else(|| Error::NotFound {
            what: format!(
                "no request with span id or trace id {id} in {} ({} requests)",
                requests_path.display(),
                requests.len()
            ),
        })?
    };
    let trace_id = string(chosen, "trace_id").unwrap_or_default();
    let span_id = string(chosen, "span_id").unwrap_or_default();
    let mut operations: HashMap<String, String> = HashMap::new();
    for r in &requests {
        if let Some(s) = string(r, "span_id") {
            let label = format!(
                "[{}] {}",
                string(r, "service").unwrap_or_default(),
                string(r, "operation").unwrap_or_default()
            );
            operations.insert(s, label);
        }
    }
    let ours = |row: &[(String, Cell)]| {
        get(row, "span_id").as_str() == Some(span_id.as_str())
            && get(row, "trace_id").as_str() == Some(trace_id.as_str())
    };

    let critical_path = joined_pieces(read_rows(&dir.join(CRITICAL_PATH), |r| ours(r))?);
    let summary: Vec<ReportSummaryRow> = read_rows(&dir.join(REQUEST_SUMMARY), |r| ours(r))?
        .iter()
        .map(|r| ReportSummaryRow {
            state: string(r, "state").unwrap_or_default(),
            tid: get(r, "tid").as_i64(),
            comm: string(r, "comm"),
            blocked_by_request: string(r, "blocked_by_request"),
            ns: uint(r, "ns"),
            throttled_ns: uint(r, "throttled_ns"),
            contended_ns: uint(r, "contended_ns"),
            wakeup_ns: uint(r, "wakeup_ns"),
        })
        .collect();
    let syscalls = read_rows(&dir.join(REQUEST_SYSCALLS), |r| ours(r))?
        .iter()
        .map(|r| (string(r, "syscall").unwrap_or_default(), uint(r, "ns")))
        .collect();
    let (mut diagnosis, mut anomalous, mut baseline_ns) = (None, false, None);
    let diagnoses_path = dir.join(DIAGNOSES);
    if diagnoses_path.is_file() {
        if let Some(row) = read_rows(&diagnoses_path, |r| ours(r))?.first() {
            anomalous = get(row, "anomalous").as_bool().unwrap_or(false);
            baseline_ns = get(row, "baseline_ns").as_u64();
            if let Some(cause) = string(row, "cause") {
                let cause_of = |text: String| {
                    Cause::from_name(&text).ok_or_else(|| Error::Schema {
                        path: diagnoses_path.clone(),
                        what: format!("unknown cause {text:?}"),
                    })
                };
                // Version 2 tables: the root cause.
                let root_cause = match string(row, "root_cause") {
                    Some(root) => Some(RootCauseDoc {
                        cause: cause_of(root)?,
                        chain: string(row, "root_chain"),
                        culprits: parse_json_column(row, "root_culprits_json", &diagnoses_path)?,
                        evidence: parse_json_column(row, "root_evidence_json", &diagnoses_path)?,
                        headline: string(row, "root_headline").unwrap_or_default(),
                    }),
                    None => None,
                };
                diagnosis = Some(DiagnosisDoc {
                    cause: cause_of(cause)?,
                    culprits: parse_json_column(row, "culprits_json", &diagnoses_path)?,
                    evidence: parse_json_column(row, "evidence_json", &diagnoses_path)?,
                    headline: string(row, "headline").unwrap_or_default(),
                    root_cause,
                });
            }
        }
    }
    let blockers = summary
        .iter()
        .filter_map(|s| s.blocked_by_request.clone())
        .filter_map(|b| operations.get(&b).map(|op| (b, op.clone())))
        .collect();
    Ok(Report {
        request: report_request(chosen),
        critical_path,
        summary,
        lost_events: uint(chosen, "lost_events"),
        diagnosis,
        details: ReportDetails {
            anomalous,
            baseline_ns,
            sync: string(chosen, "sync").unwrap_or_default(),
            truncated: get(chosen, "truncated").as_bool().unwrap_or(false),
            syscalls,
            blockers,
        },
    })
}

/// A JSON text column of the `diagnoses` table read as its type; empty
/// when null.
fn parse_json_column<T: DeserializeOwned + Default>(
    row: &[(String, Cell)],
    name: &str,
    path: &Path,
) -> Result<T, Error> {
    match get(row, name).as_str() {
        Some(text) => serde_json::from_str(text).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            at: None,
            source,
        }),
        None => Ok(T::default()),
    }
}

fn report_request(row: &[(String, Cell)]) -> ReportRequest {
    ReportRequest {
        trace_id: string(row, "trace_id").unwrap_or_default(),
        span_id: string(row, "span_id").unwrap_or_default(),
        service: string(row, "service").unwrap_or_default(),
        operation: string(row, "operation").unwrap_or_default(),
        start_ns: uint(row, "start_ns"),
        end_ns: uint(row, "end_ns"),
    }
}

/// One request's rows of the critical-path table, in path order, as a
/// report's pieces. The tables tell apart pieces that differ only in which
/// span of the request the thread worked for; a report does not.
fn joined_pieces(mut rows: Vec<Vec<(String, Cell)>>) -> Vec<ReportPiece> {
    rows.sort_by_key(|r| get(r, "seq").as_i64().unwrap_or(0));
    let mut critical_path: Vec<ReportPiece> = Vec::with_capacity(rows.len());
    let read = rows.iter().map(|r| ReportPiece {
        start_ns: uint(r, "start_ns"),
        end_ns: uint(r, "end_ns"),
        state: string(r, "state").unwrap_or_default(),
        tid: get(r, "tid").as_i64(),
        comm: string(r, "comm"),
        syscall: string(r, "syscall"),
        blocked_by_request: string(r, "blocked_by_request"),
        detail: string(r, "detail"),
        preempted_by: get(r, "preempted_by_tid")
            .as_i64()
            .map(|t| (t, string(r, "preempted_by_comm"))),
        throttled_ns: uint(r, "throttled_ns"),
        contended_ns: uint(r, "contended_ns"),
        wakeup_ns: uint(r, "wakeup_ns"),
        lost: get(r, "lost").as_bool().unwrap_or(false),
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
    let is_wanted = |r: &[(String, Cell)]| {
        get(r, "span_id")
            .as_str()
            .is_some_and(|s| wanted.contains(s))
    };
    let requests = read_rows(&dir.join(REQUESTS), |r| is_wanted(r))?;
    type Row = Vec<(String, Cell)>;
    let mut rows_of: HashMap<(String, String), Vec<Row>> = HashMap::new();
    for row in read_rows(&dir.join(CRITICAL_PATH), |r| is_wanted(r))? {
        let key = (
            string(&row, "trace_id").unwrap_or_default(),
            string(&row, "span_id").unwrap_or_default(),
        );
        rows_of.entry(key).or_default().push(row);
    }
    span_ids
        .iter()
        .map(|id| {
            let row = requests
                .iter()
                .find(|r| get(r, "span_id").as_str() == Some(id.as_str()))
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
