//! `requests.json`: the requests (slowest first) with their top causes, and
//! the operations, in one small document for the UI and for scripts. The
//! Parquet tables hold everything; this holds what a first look needs.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use deepspan_run::Run;
use serde::{Deserialize, Serialize};

pub use crate::diagnosis::{CulpritDoc, DiagnosisDoc, Evidence, EvidenceValue, RootCauseDoc};
use crate::tables::path_state_name;
use crate::{cause_label, span_hex, trace_hex, AnalysisResults, Error};
use deepspan_analysis::RequestTotals;

/// Causes and system calls kept per request and per operation.
pub const TOP: usize = 5;

/// What the writer streams: [`RequestsDoc`]'s fields, in its order, with
/// the requests made one at a time.
#[derive(Serialize)]
struct Doc<'a> {
    format_version: u32,
    trace: TraceInfo,
    notes: &'a [String],
    requests: Requests<'a>,
    operations: Vec<OperationEntry>,
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
                .filter_map(|&i| request_entry(self.results, i)),
        )
    }
}

/// `requests.json` as a whole, read back ([`read_requests_json`]): the
/// types the writer writes, so a field cannot be written and read apart.
/// (The writer streams the requests instead of holding this.) What names a
/// request and its time is required; the details read as empty when a
/// file has none, as files written before them do.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestsDoc {
    pub format_version: u32,
    #[serde(default)]
    pub trace: TraceInfo,
    #[serde(default)]
    pub notes: Vec<String>,
    /// Slowest first.
    pub requests: Vec<RequestEntry>,
    #[serde(default)]
    pub operations: Vec<OperationEntry>,
}

/// The kernel trace the analysis read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceInfo {
    pub file: String,
    pub events: u64,
    pub lost_events: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub threads: usize,
}

/// One request (a span with a critical path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub trace_id: String,
    pub span_id: String,
    #[serde(default)]
    pub parent_span_id: Option<String>,
    pub service: String,
    pub operation: String,
    /// OTLP span kind, lower case.
    pub kind: Cow<'static, str>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub duration_ns: u64,
    /// How the span was placed (`SyncSource` names).
    pub sync: Cow<'static, str>,
    #[serde(default)]
    pub tid: Option<i32>,
    #[serde(default)]
    pub lost_events: u64,
    #[serde(default)]
    pub truncated: bool,
    #[serde(default)]
    pub totals: Totals,
    /// The largest parts of its path by (state, thread, blocking request).
    #[serde(default)]
    pub causes: Vec<Cause>,
    /// As `causes`, the blocking requests grouped by `[service] operation`.
    #[serde(default)]
    pub cause_groups: Vec<CauseGroup>,
    #[serde(default)]
    pub syscalls: Vec<SyscallTime>,
    #[serde(default)]
    pub baseline_ns: Option<u64>,
    #[serde(default)]
    pub anomalous: bool,
    /// Null without a kernel path (and in analyses made before diagnoses).
    #[serde(default)]
    pub diagnosis: Option<DiagnosisDoc>,
    /// Its time queued at its host before its span started; null when its
    /// arrival is not known.
    #[serde(default)]
    pub queue: Option<QueueDoc>,
    /// Where its pieces are in `critical_path.parquet`, for a reader that
    /// wants one request's pieces without reading every request's (null in
    /// analyses made before it was kept).
    #[serde(default)]
    pub critical_path_rows: Option<TableRows>,
}

/// Consecutive rows of a table of the analysis: `first` (the table's
/// first row is 0) and the `count` rows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRows {
    pub first: u64,
    pub count: u64,
}

impl TableRows {
    pub fn range(self) -> std::ops::Range<u64> {
        self.first..self.first.saturating_add(self.count)
    }
}

impl From<&std::ops::Range<u64>> for TableRows {
    fn from(rows: &std::ops::Range<u64>) -> TableRows {
        TableRows {
            first: rows.start,
            count: rows.end.saturating_sub(rows.start),
        }
    }
}

/// A request's time queued at its host before its span started (an event
/// loop or a pool busy with other requests, a lock, a CPU).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueDoc {
    /// When the request reached the host (CLOCK_MONOTONIC ns).
    pub arrival_ns: u64,
    /// What says so: `client_send` (the client's send, on a traced host)
    /// or `server_receive` (the server's first receive of it).
    pub arrival_by: String,
    /// From the arrival to the span's start.
    pub ns: u64,
    /// Where that time went, the requests it was queued behind grouped
    /// by `[service] operation`, largest first.
    #[serde(default)]
    pub cause_groups: Vec<CauseGroup>,
    /// What it mostly waited for: `blocked_by_request` when the thread that
    /// took it up was busy with other requests meanwhile.
    #[serde(default)]
    pub diagnosis: Option<DiagnosisDoc>,
    /// Where its pieces are in `queue_path.parquet` (null in analyses made
    /// before it was kept).
    #[serde(default)]
    pub queue_path_rows: Option<TableRows>,
}

/// A request's time by kind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    pub running_ns: u64,
    pub preempted_ns: u64,
    pub throttled_ns: u64,
    pub blocked_by_requests_ns: u64,
    pub unknown_ns: u64,
}

impl From<RequestTotals> for Totals {
    fn from(t: RequestTotals) -> Totals {
        Totals {
            running_ns: t.running_ns,
            preempted_ns: t.preempted_ns,
            throttled_ns: t.throttled_ns,
            blocked_by_requests_ns: t.blocked_by_requests_ns,
            unknown_ns: t.unknown_ns,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    pub label: String,
    pub state: Cow<'static, str>,
    #[serde(default)]
    pub tid: Option<i32>,
    #[serde(default)]
    pub comm: Option<String>,
    #[serde(default)]
    pub blocked_by_request: Option<String>,
    pub ns: u64,
    pub share: f64,
    #[serde(default)]
    pub throttled_ns: u64,
    #[serde(default)]
    pub contended_ns: u64,
    #[serde(default)]
    pub wakeup_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CauseGroup {
    pub label: String,
    /// The blocking requests' `[service] operation`; null for the
    /// request's own time.
    #[serde(default)]
    pub blocked_by_operation: Option<String>,
    /// The blocking requests (span ids), most time first.
    #[serde(default)]
    pub blocked_by_requests: Vec<String>,
    /// State of the largest part.
    pub state: Cow<'static, str>,
    pub ns: u64,
    pub share: f64,
    /// Per (state, thread).
    #[serde(default)]
    pub parts: Vec<CausePart>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CausePart {
    pub label: String,
    pub state: Cow<'static, str>,
    pub ns: u64,
    #[serde(default)]
    pub throttled_ns: u64,
    #[serde(default)]
    pub contended_ns: u64,
    #[serde(default)]
    pub wakeup_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyscallTime {
    pub syscall: String,
    pub ns: u64,
}

/// One (service, operation) over all its requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationEntry {
    pub service: String,
    pub operation: String,
    pub requests: usize,
    pub total_ns: u64,
    pub mean_ns: u64,
    pub max_ns: u64,
    #[serde(default)]
    pub causes: Vec<OperationCause>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationCause {
    pub state: Cow<'static, str>,
    #[serde(default)]
    pub comm: Option<String>,
    pub blocked_by_requests: bool,
    pub ns: u64,
    pub share: f64,
}

/// Reads `RUN/analysis/requests.json`.
pub fn read_requests_json(run_dir: &Path) -> Result<RequestsDoc, Error> {
    let path = Run::new(run_dir).requests_json();
    if !path.is_file() {
        return Err(Error::NotFound {
            what: format!(
                "{} has no analysis ({} is missing): run `deepspan analyze {}` first",
                run_dir.display(),
                path.display(),
                run_dir.display()
            ),
        });
    }
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))?;
    parse_json_file::<RequestsDoc>(&bytes, &path)
}

/// The text of the analysis file `path` as a `T`; a value of the wrong type
/// or a missing one is reported with its JSON path
/// (`requests[3].diagnosis.cause`) besides its line and column.
pub(crate) fn parse_json_file<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| {
        // Parsed again to find where: only a failed read pays for it.
        let at = e.is_data().then(|| {
            let de = &mut serde_json::Deserializer::from_slice(bytes);
            match serde_path_to_error::deserialize::<_, T>(de) {
                Err(e) if e.path().iter().next().is_some() => Some(e.path().to_string()),
                _ => None,
            }
        });
        Error::Json {
            path: path.to_path_buf(),
            at: at.flatten(),
            source: e,
        }
    })
}

/// The requests' indices in `requests.json`'s order: slowest first.
fn request_order(r: &AnalysisResults) -> Vec<usize> {
    let mut order: Vec<usize> = (0..r.requests.len()).collect();
    order.sort_by_key(|&i| {
        let p = &r.requests[i].path;
        (std::cmp::Reverse(p.duration()), p.start, p.request)
    });
    order
}

/// The entries of `requests.json`'s `requests`, as [`write_requests_json`]
/// writes them, in memory.
pub fn request_entries(r: &AnalysisResults) -> Vec<RequestEntry> {
    request_order(r)
        .into_iter()
        .filter_map(|i| request_entry(r, i))
        .collect()
}

/// Writes `requests.json` at `path`.
pub fn write_requests_json(path: &Path, r: &AnalysisResults) -> Result<(), Error> {
    let order = request_order(r);
    let operations = r
        .operations
        .iter()
        .map(|op| {
            let total = op.total_ns.max(1) as f64;
            OperationEntry {
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
                    .map(|row| OperationCause {
                        state: path_state_name(row.state).into(),
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
            file: r.trace_file.to_string(),
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
    // Compact: indentation was 40 % of the bytes (400 MB for 10⁵
    // requests); `jq .` shows it indented.
    serde_json::to_writer(&mut out, &doc).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        at: None,
        source: e,
    })?;
    out.write_all(b"\n")
        .and_then(|()| out.flush())
        .map_err(|e| Error::io(path, "cannot write", e))?;
    Ok(())
}

/// One request's entry; `None` for a path of no known span.
fn request_entry(r: &AnalysisResults, i: usize) -> Option<RequestEntry> {
    let rec = &r.requests[i];
    let (p, s) = (&rec.path, &rec.summary);
    let span = r.spans.get(p.request as usize)?;
    let total = s.total_ns.max(1) as f64;
    Some(RequestEntry {
        trace_id: trace_hex(span.trace_id),
        span_id: span_hex(span.span_id),
        parent_span_id: span.parent_span_id.map(span_hex),
        service: span.service.clone(),
        operation: span.operation.clone(),
        kind: span.kind.into(),
        start_ns: p.start,
        end_ns: p.end,
        duration_ns: p.duration(),
        sync: p.sync.name().into(),
        tid: p.home.first().map(|h| h.tid),
        lost_events: rec.lost_events,
        truncated: p.truncated,
        totals: rec.totals.clone().into(),
        causes: s
            .by_state
            .iter()
            .take(TOP)
            .map(|row| Cause {
                label: cause_label(row, r.spans),
                state: path_state_name(row.state).into(),
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
        cause_groups: cause_group_docs(s, r.spans, crate::cause_group_label),
        syscalls: s
            .by_syscall
            .iter()
            .take(TOP)
            .map(|(label, ns)| SyscallTime {
                syscall: label.clone(),
                ns: *ns,
            })
            .collect(),
        baseline_ns: rec.baseline_ns,
        anomalous: rec.anomalous,
        diagnosis: rec
            .diagnosis
            .as_ref()
            .map(|d| DiagnosisDoc::new(d, r.spans)),
        queue: rec.queue.as_ref().map(|q| QueueDoc {
            arrival_ns: q.arrival.ts,
            arrival_by: q.arrival.by.name().to_string(),
            ns: q.ns,
            cause_groups: cause_group_docs(&q.summary, r.spans, crate::queue_group_label),
            diagnosis: q.diagnosis.as_ref().map(|d| DiagnosisDoc::new(d, r.spans)),
            queue_path_rows: q.path_rows.as_ref().map(TableRows::from),
        }),
        critical_path_rows: rec.path_rows.as_ref().map(TableRows::from),
    })
}

/// The summary's causes, the blocking requests grouped by operation, each
/// group named by `label`, largest first ([`TOP`] of them).
fn cause_group_docs(
    summary: &deepspan_analysis::RequestSummary,
    spans: &[crate::SpanMeta],
    label: fn(&deepspan_analysis::CauseGroup<String>, &[crate::SpanMeta]) -> String,
) -> Vec<CauseGroup> {
    let total = summary.total_ns.max(1) as f64;
    crate::cause_groups(summary, spans)
        .into_iter()
        .take(TOP)
        .map(|g| CauseGroup {
            label: label(&g, spans),
            blocked_by_requests: g
                .requests
                .iter()
                .filter_map(|(b, _)| spans.get(*b as usize))
                .map(|b| span_hex(b.span_id))
                .collect(),
            state: g
                .parts
                .first()
                .map_or("UNKNOWN", |p| path_state_name(p.state))
                .into(),
            ns: g.ns,
            share: g.ns as f64 / total,
            parts: g
                .parts
                .iter()
                .map(|row| CausePart {
                    label: part_label(row, spans),
                    state: path_state_name(row.state).into(),
                    ns: row.ns,
                    throttled_ns: row.throttled_ns,
                    contended_ns: row.contended_ns,
                    wakeup_ns: row.wakeup_ns,
                })
                .collect(),
            blocked_by_operation: g.blocked_by,
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A run folder whose `requests.json` is `doc`.
    fn run_with(doc: &serde_json::Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let path = Run::new(dir.path()).requests_json();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
        dir
    }

    /// A request with what names it and its time, and `diagnosis`.
    fn doc_with(diagnosis: serde_json::Value) -> serde_json::Value {
        json!({"format_version": 1, "requests": [
            {"trace_id": "0".repeat(32), "span_id": "00000000000000aa", "service": "media",
             "operation": "GET /image", "kind": "server", "start_ns": 1, "end_ns": 3,
             "duration_ns": 2, "sync": "exact", "diagnosis": diagnosis}
        ]})
    }

    #[test]
    fn an_older_file_and_unknown_keys_still_read() {
        // Before root causes, with keys a later version may add.
        let dir = run_with(&doc_with(json!({
            "cause": "lock_contention", "headline": "LOCK 90%",
            "evidence": {"share": 0.9, "futex_uaddr": 4096},
            "culprits": [{"kind": "thread", "tid": 7, "ns": 5, "cpu": 3}],
            "confidence": "high"
        })));
        let doc = read_requests_json(dir.path()).unwrap();
        let d = doc.requests[0].diagnosis.as_ref().unwrap();
        assert_eq!(d.cause.name(), "lock_contention");
        assert_eq!(d.root_cause, None);
        assert_eq!(d.root_cause().name(), "lock_contention");
        assert_eq!(d.culprits[0].tid, Some(7));
        assert_eq!(d.culprits[0].comm, None);
        assert_eq!(d.evidence.get("futex_uaddr").unwrap().as_i64(), Some(4096));
        // No diagnosis at all: null, or no key.
        let dir = run_with(&doc_with(serde_json::Value::Null));
        assert_eq!(
            read_requests_json(dir.path()).unwrap().requests[0].diagnosis,
            None
        );
        let mut older = doc_with(serde_json::Value::Null);
        older["requests"][0]
            .as_object_mut()
            .unwrap()
            .remove("diagnosis");
        let dir = run_with(&older);
        assert_eq!(
            read_requests_json(dir.path()).unwrap().requests[0].diagnosis,
            None
        );
    }

    #[test]
    fn a_malformed_diagnosis_is_reported_with_its_json_path() {
        let dir = run_with(&doc_with(json!({
            "cause": "lock_contention", "headline": "", "evidence": {},
            "culprits": [{"kind": "thread", "ns": 5}, {"kind": "planet", "ns": 1}]
        })));
        let e = read_requests_json(dir.path()).unwrap_err().to_string();
        let file = Run::new(dir.path()).requests_json();
        assert!(
            e.starts_with(&format!(
                "{}: invalid JSON at requests[0].diagnosis.culprits[1].kind: unknown culprit kind `planet`",
                file.display()
            )),
            "{e}"
        );
        assert!(e.contains(" at line "), "{e}");
        for (diagnosis, at) in [
            (json!({"cause": 3}), "requests[0].diagnosis.cause"),
            (json!({"headline": "no cause"}), "requests[0].diagnosis"),
            (
                json!({"cause": "disk", "evidence": {"ns": "5 ms"}}),
                "requests[0].diagnosis.evidence.ns",
            ),
            (
                json!({"cause": "disk", "root_cause": {"cause": "disk", "chain": 1}}),
                "requests[0].diagnosis.root_cause.chain",
            ),
        ] {
            let dir = run_with(&doc_with(diagnosis));
            let e = read_requests_json(dir.path()).unwrap_err().to_string();
            assert!(e.contains(&format!("invalid JSON at {at}: ")), "{e}");
        }
    }

    #[test]
    fn a_malformed_file_is_reported_with_its_file_and_json_path() {
        let mut doc = doc_with(serde_json::Value::Null);
        doc["requests"][0]["duration_ns"] = json!("2 ns");
        let dir = run_with(&doc);
        let e = read_requests_json(dir.path()).unwrap_err().to_string();
        let file = Run::new(dir.path()).requests_json();
        assert!(
            e.starts_with(&format!(
                "{}: invalid JSON at requests[0].duration_ns: invalid type: string \"2 ns\"",
                file.display()
            )),
            "{e}"
        );
        assert!(e.contains(" at line "), "{e}");
        doc["requests"][0]["duration_ns"] = json!(2);
        doc["requests"][0]
            .as_object_mut()
            .unwrap()
            .remove("span_id");
        std::fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();
        let e = read_requests_json(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(": invalid JSON at requests[0]: missing field `span_id`"),
            "{e}"
        );
        // Not JSON at all: where, by line and column only (as before).
        std::fs::write(&file, b"{\"requests\": [").unwrap();
        let e = read_requests_json(dir.path()).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: invalid JSON: EOF while parsing a list at line 1 column 14",
                file.display()
            )
        );
    }

    #[test]
    fn requests_read_back_write_the_same_bytes() {
        let diagnosis = json!({
            "cause": "blocked_by_request",
            "culprits": [{"comm": "pricing", "kind": "process", "ns": 70, "pid": 5},
                         {"kind": "request", "ns": 20, "operation": "GET /price", "service": "pricing",
                          "span_id": "00000000000000bb", "trace_id": "0".repeat(32)}],
            "evidence": {"blocked_ns": 90, "ns": 90, "share": 0.9},
            "headline": "BLOCKED 90%",
            "root_cause": {"cause": "cpu_throttled", "chain": "[media] GET /image → behind [pricing] GET /price → PREEMPTED (throttled) 78 %",
                           "culprits": [{"comm": "pricing", "kind": "process", "ns": 70, "pid": 5}],
                           "evidence": {"depth": 1, "ns": 70, "share": 0.7}, "headline": "PREEMPTED 70%"}
        });
        let dir = run_with(&doc_with(diagnosis.clone()));
        let doc = read_requests_json(dir.path()).unwrap();
        let d = doc.requests[0].diagnosis.as_ref().unwrap();
        assert_eq!(
            serde_json::to_string_pretty(d).unwrap(),
            serde_json::to_string_pretty(&diagnosis).unwrap()
        );
    }
}
