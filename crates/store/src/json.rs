//! `requests.json`: the requests (slowest first) with their top causes, and
//! the operations, in one small document for the UI and for scripts. The
//! Parquet tables hold everything; this holds what a first look needs.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::tables::{path_state_name, RequestTotals};
use crate::{cause_label, span_hex, trace_hex, AnalysisResults, Error};

/// Causes and system calls kept per request and per operation.
pub const TOP: usize = 5;

#[derive(Serialize)]
struct Doc<'a> {
    format_version: u32,
    trace: TraceInfo<'a>,
    notes: &'a [String],
    requests: Requests<'a>,
    operations: Vec<OperationJson>,
}

/// The requests in their order, each made as it is written: the whole list
/// at once (diagnoses as JSON trees) was a fixed cost of tens of MB for a
/// few thousand requests, whatever the trace size.
struct Requests<'a> {
    results: &'a AnalysisResults<'a>,
    order: Vec<usize>,
}

impl Serialize for Requests<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.order
                .iter()
                .filter_map(|&i| request_json(self.results, i)),
        )
    }
}

#[derive(Serialize)]
struct TraceInfo<'a> {
    file: &'a str,
    events: u64,
    lost_events: u64,
    start_ns: u64,
    end_ns: u64,
    threads: usize,
}

#[derive(Serialize)]
struct RequestJson {
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    service: String,
    operation: String,
    kind: &'static str,
    start_ns: u64,
    end_ns: u64,
    duration_ns: u64,
    sync: &'static str,
    tid: Option<i32>,
    lost_events: u64,
    truncated: bool,
    totals: TotalsJson,
    causes: Vec<CauseJson>,
    /// As `causes`, the blocking requests grouped by `[service] operation`.
    cause_groups: Vec<CauseGroupJson>,
    syscalls: Vec<SyscallJson>,
    baseline_ns: Option<u64>,
    anomalous: bool,
    diagnosis: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct TotalsJson {
    running_ns: u64,
    preempted_ns: u64,
    throttled_ns: u64,
    blocked_by_requests_ns: u64,
    unknown_ns: u64,
}

impl From<RequestTotals> for TotalsJson {
    fn from(t: RequestTotals) -> TotalsJson {
        TotalsJson {
            running_ns: t.running_ns,
            preempted_ns: t.preempted_ns,
            throttled_ns: t.throttled_ns,
            blocked_by_requests_ns: t.blocked_by_requests_ns,
            unknown_ns: t.unknown_ns,
        }
    }
}

#[derive(Serialize)]
struct CauseJson {
    label: String,
    state: &'static str,
    tid: Option<i32>,
    comm: Option<String>,
    blocked_by_request: Option<String>,
    ns: u64,
    share: f64,
    throttled_ns: u64,
    contended_ns: u64,
    wakeup_ns: u64,
}

#[derive(Serialize)]
struct CauseGroupJson {
    label: String,
    /// The blocking requests' `[service] operation`; null for the
    /// request's own time.
    blocked_by_operation: Option<String>,
    /// The blocking requests (span ids), most time first.
    blocked_by_requests: Vec<String>,
    /// State of the largest part.
    state: &'static str,
    ns: u64,
    share: f64,
    /// Per (state, thread): `label`, `state`, `ns`.
    parts: Vec<CausePartJson>,
}

#[derive(Serialize)]
struct CausePartJson {
    label: String,
    state: &'static str,
    ns: u64,
    throttled_ns: u64,
    contended_ns: u64,
    wakeup_ns: u64,
}

#[derive(Serialize)]
struct SyscallJson {
    syscall: String,
    ns: u64,
}

#[derive(Serialize)]
struct OperationJson {
    service: String,
    operation: String,
    requests: usize,
    total_ns: u64,
    mean_ns: u64,
    max_ns: u64,
    causes: Vec<OperationCauseJson>,
}

#[derive(Serialize)]
struct OperationCauseJson {
    state: &'static str,
    comm: Option<String>,
    blocked_by_requests: bool,
    ns: u64,
    share: f64,
}

/// Writes `requests.json` at `path`.
pub fn write_requests_json(path: &Path, r: &AnalysisResults) -> Result<(), Error> {
    let mut order: Vec<usize> = (0..r.requests.len()).collect();
    order.sort_by_key(|&i| {
        let p = &r.requests[i].path;
        (std::cmp::Reverse(p.duration()), p.start, p.request)
    });
    let operations = r
        .operations
        .iter()
        .map(|op| {
            let total = op.total_ns.max(1) as f64;
            OperationJson {
                service: op.key.0.clone(),
                operation: op.key.1.clone(),
                requests: op.requests,
                total_ns: op.total_ns,
                mean_ns: op.total_ns / op.requests.max(1) as u64,
                max_ns: op.max_ns,
                causes: op
                    .rows
                    .iter()
                    .take(TOP)
                    .map(|row| OperationCauseJson {
                        state: path_state_name(row.state),
                        comm: row.comm.map(|c| c.to_string_lossy()),
                        blocked_by_requests: row.blocked,
                        ns: row.ns,
                        share: row.ns as f64 / total,
                    })
                    .collect(),
            }
        })
        .collect();
    let (start_ns, end_ns) = r.model.time_range();
    let doc = Doc {
        format_version: 1,
        trace: TraceInfo {
            file: r.trace_file,
            events: r.events,
            lost_events: r.lost_events,
            start_ns,
            end_ns,
            threads: r.model.threads().count(),
        },
        notes: r.notes,
        requests: Requests { results: r, order },
        operations,
    };
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, "cannot create", e))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, &doc).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        source: e,
    })?;
    out.write_all(b"\n")
        .and_then(|()| out.flush())
        .map_err(|e| Error::io(path, "cannot write", e))?;
    Ok(())
}

/// One request's entry; `None` for a path of no known span.
fn request_json(r: &AnalysisResults, i: usize) -> Option<RequestJson> {
    let rec = &r.requests[i];
    let (p, s) = (&rec.path, &rec.summary);
    let span = r.spans.get(p.request as usize)?;
    let total = s.total_ns.max(1) as f64;
    Some(RequestJson {
        trace_id: trace_hex(span.trace_id),
        span_id: span_hex(span.span_id),
        parent_span_id: span.parent_span_id.map(span_hex),
        service: span.service.clone(),
        operation: span.operation.clone(),
        kind: span.kind,
        start_ns: p.start,
        end_ns: p.end,
        duration_ns: p.duration(),
        sync: p.sync.name(),
        tid: p.home.first().map(|h| h.2),
        lost_events: rec.lost_events,
        truncated: p.truncated,
        totals: rec.totals.clone().into(),
        causes: s
            .by_state
            .iter()
            .take(TOP)
            .map(|row| CauseJson {
                label: cause_label(row, r.spans),
                state: path_state_name(row.state),
                tid: row.tid,
                comm: row.comm.map(|c| c.to_string_lossy()),
                blocked_by_request: row
                    .blocked_by
                    .and_then(|b| r.spans.get(b as usize))
                    .map(|b| span_hex(b.span_id)),
                ns: row.ns,
                share: row.ns as f64 / total,
                throttled_ns: row.throttled_ns,
                contended_ns: row.contended_ns,
                wakeup_ns: row.wakeup_ns,
            })
            .collect(),
        cause_groups: crate::cause_groups(s, r.spans)
            .into_iter()
            .take(TOP)
            .map(|g| CauseGroupJson {
                label: crate::cause_group_label(&g, r.spans),
                blocked_by_requests: g
                    .requests
                    .iter()
                    .filter_map(|(b, _)| r.spans.get(*b as usize))
                    .map(|b| span_hex(b.span_id))
                    .collect(),
                state: g
                    .parts
                    .first()
                    .map_or("UNKNOWN", |p| path_state_name(p.state)),
                ns: g.ns,
                share: g.ns as f64 / total,
                parts: g
                    .parts
                    .iter()
                    .map(|row| CausePartJson {
                        label: part_label(row, r.spans),
                        state: path_state_name(row.state),
                        ns: row.ns,
                        throttled_ns: row.throttled_ns,
                        contended_ns: row.contended_ns,
                        wakeup_ns: row.wakeup_ns,
                    })
                    .collect(),
                blocked_by_operation: g.blocked_by,
            })
            .collect(),
        syscalls: s
            .by_syscall
            .iter()
            .take(TOP)
            .map(|(label, ns)| SyscallJson {
                syscall: label.clone(),
                ns: *ns,
            })
            .collect(),
        baseline_ns: rec.baseline_ns,
        anomalous: rec.anomalous,
        diagnosis: rec
            .diagnosis
            .as_ref()
            .map(|d| crate::diagnosis::diagnosis_json(d, r.spans)),
    })
}

/// A part of a group, labelled as its thread's state (the group names the
/// blocking requests already).
fn part_label(row: &deepspan_analysis::SummaryRow, spans: &[crate::SpanMeta]) -> String {
    let own = deepspan_analysis::SummaryRow {
        blocked_by: None,
        ..row.clone()
    };
    cause_label(&own, spans)
}
