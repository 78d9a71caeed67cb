//! Placement of spans without deepspan fields, as the analysis leaves it:
//! `RUN/analysis/placements.json`, and the notes on placement and clock
//! mapping.

use std::path::Path;

use deepspan_analysis::{OffsetBound, Placement, SyncSource};
use deepspan_spans::{ClockMap, Span};
use deepspan_store::RequestRecord;

use crate::Error;

/// What the requests placed on threads say of the clock mapping.
pub(crate) fn offset_note(b: &OffsetBound) -> String {
    let us = |ns: i64| ns as f64 / 1e3;
    let verdict = if b.lower_ns <= 0 && 0 <= b.upper_ns {
        "consistent with the mapping as is".to_string()
    } else {
        let off = if b.lower_ns > 0 {
            b.lower_ns
        } else {
            b.upper_ns
        };
        format!(
            "the mapped span times are off by at least {:.1} µs",
            us(off)
        )
    };
    format!(
        "clock mapping checked against the requests placed on a thread: {} of {} ran at their spans' start (after their receive) and end for a correction between {:+.1} and {:+.1} µs: {verdict}",
        b.agreeing,
        b.of,
        us(b.lower_ns),
        us(b.upper_ns)
    )
}

/// `RUN/analysis/placements.json`: how each span without deepspan fields
/// was placed, with its evidence.
pub const PLACEMENTS_JSON: &str = "placements.json";

/// One line of [`PLACEMENTS_JSON`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlacementRecord {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// `inferred` (on a thread) or `process`.
    pub sync: String,
    pub pid: i32,
    /// The thread, when placed on one.
    pub tid: Option<i32>,
    /// 0 to 1, rounded to 3 decimals.
    pub confidence: f64,
    /// Why there, in sentences.
    pub evidence: Vec<String>,
}

pub(crate) fn write_placements(
    path: &Path,
    spans: &[Span],
    placements: &[Option<Placement>],
) -> Result<(), Error> {
    let records: Vec<PlacementRecord> = spans
        .iter()
        .zip(placements)
        .filter_map(|(s, p)| {
            let p = p.as_ref()?;
            Some(PlacementRecord {
                trace_id: format!("{:032x}", s.trace_id.0),
                span_id: format!("{:016x}", s.span_id.0),
                sync: p.method.name().to_string(),
                pid: p.pid,
                tid: p.tid,
                confidence: (p.confidence * 1000.0).round() / 1000.0,
                evidence: p.evidence.clone(),
            })
        })
        .collect();
    let write_error = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let text = serde_json::to_vec_pretty(&serde_json::json!({ "placements": records }))
        .map_err(|e| write_error(e.into()))?;
    std::fs::write(path, text).map_err(write_error)
}

/// The placement of request `span_id` from a run's `placements.json`.
pub fn read_placement(run: &Path, span_id: &str) -> Option<PlacementRecord> {
    let text = std::fs::read(run.join("analysis").join(PLACEMENTS_JSON)).ok()?;
    let mut doc: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let list: Vec<PlacementRecord> = serde_json::from_value(doc["placements"].take()).ok()?;
    list.into_iter().find(|p| p.span_id == span_id)
}

/// Notes on how the requests were placed (clock mapping precision, counts
/// per method, requests without a thread).
pub(crate) fn sync_notes(
    requests: &[RequestRecord],
    clock: Option<&ClockMap>,
    thread_id_told: bool,
    notes: &mut Vec<String>,
) {
    let count = |s: SyncSource| requests.iter().filter(|r| r.path.sync == s).count();
    let mapped = count(SyncSource::ClockMapped);
    if mapped > 0 {
        let precision = clock.map_or(0, |c| c.precision_ns());
        notes.push(format!(
            "{mapped} request(s) placed through the clock samples (sync: clock_mapped), precision about {:.1} µs",
            precision as f64 / 1e3
        ));
    }
    let inferred = count(SyncSource::Inferred);
    let process = count(SyncSource::Process);
    if inferred + process > 0 {
        notes.push(format!(
            "placement: {} exact (SDK), {mapped} clock_mapped, {inferred} inferred on a thread from the kernel trace, {process} on their process as a whole (sync: process), {} none; evidence in analysis/{PLACEMENTS_JSON}",
            count(SyncSource::Exact),
            count(SyncSource::None)
        ));
    }
    let none = count(SyncSource::None);
    if none > 0 {
        let hint = if thread_id_told {
            ""
        } else {
            "; if their `thread.id` attribute is the OS thread id, pass --thread-id-is-os-tid"
        };
        notes.push(format!(
            "{none} request(s) carry no OS thread (no deepspan fields; sync: none) and have no kernel path{hint}"
        ));
    }
}
