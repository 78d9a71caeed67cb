//! Placement of spans without deepspan fields, as the analysis leaves it:
//! `RUN/analysis/placements.json`, and the notes on placement and clock
//! mapping.

use std::path::Path;

use deepspan_analysis::RequestRecord;
use deepspan_analysis::{OffsetBound, Placement, SyncSource};
use deepspan_spans::{ClockMap, Span};
use deepspan_store::placements::{
    read_placements_json, write_placements_json, PlacementRecord, PlacementsDoc,
};

use crate::Error;

/// Fewest requests placed on threads whose runs must bound the clock
/// mapping's offset before it is corrected by them.
const MIN_REQUESTS_TO_CORRECT: usize = 8;

/// The correction to apply to the clock mapping, in ns, when the requests
/// placed on threads say it is off: at least [`MIN_REQUESTS_TO_CORRECT`]
/// of them, two thirds agreeing, on a range of corrections without 0. The
/// middle of that range: the true correction is inside it, so the middle
/// is off by at most half its width.
pub(crate) fn offset_correction(b: &OffsetBound) -> Option<i64> {
    if b.of < MIN_REQUESTS_TO_CORRECT || b.agreeing * 3 < b.of * 2 {
        return None;
    }
    (b.lower_ns > 0 || b.upper_ns < 0).then(|| b.lower_ns + (b.upper_ns - b.lower_ns) / 2)
}

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
            us(off.abs())
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
    Ok(write_placements_json(
        path,
        &PlacementsDoc {
            placements: records,
        },
    )?)
}

/// The placement of request `span_id` from a run's `placements.json`.
pub fn read_placement(run: &Path, span_id: &str) -> Option<PlacementRecord> {
    let doc = read_placements_json(&deepspan_run::Run::new(run).placements_json()).ok()?;
    doc.placements.into_iter().find(|p| p.span_id == span_id)
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
            "placement: {} exact (SDK), {mapped} clock_mapped, {inferred} inferred on a thread from the kernel trace, {process} on their process as a whole (sync: process), {} none; evidence in {}/{}",
            count(SyncSource::Exact),
            count(SyncSource::None),
            deepspan_run::layout::ANALYSIS_DIR,
            deepspan_run::analysis::PLACEMENTS_JSON,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(lower_ns: i64, upper_ns: i64, agreeing: usize, of: usize) -> OffsetBound {
        OffsetBound {
            lower_ns,
            upper_ns,
            agreeing,
            of,
        }
    }

    #[test]
    fn the_mapping_is_corrected_only_when_most_placed_requests_exclude_zero() {
        // Consistent with the mapping: nothing to correct.
        assert_eq!(offset_correction(&bound(-3_000, 15_000, 80, 80)), None);
        // Off, agreed by most: the middle of the range.
        assert_eq!(
            offset_correction(&bound(36_000, 57_000, 71, 80)),
            Some(46_500)
        );
        assert_eq!(
            offset_correction(&bound(-64_000, -42_000, 63, 70)),
            Some(-53_000)
        );
        // Too few requests, or too few agreeing.
        assert_eq!(offset_correction(&bound(36_000, 57_000, 5, 5)), None);
        assert_eq!(offset_correction(&bound(36_000, 57_000, 40, 80)), None);
    }

    #[test]
    fn a_corrected_map_moves_every_mapped_time() {
        let map = ClockMap::new(&[(1_000_000, 500), (2_000_000, 1_000_500)]).unwrap();
        let moved = map.corrected(-250);
        for wall in [1_200_000, 1_500_000, 2_100_000] {
            assert_eq!(moved.wall_to_mono(wall), map.wall_to_mono(wall) - 250);
        }
    }
}
