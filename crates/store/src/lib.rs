//! deepspan's analysis results on disk: the `RUN/analysis/` folder.
//!
//! - Parquet tables (one file each, documented in docs/tables.md), readable
//!   by DuckDB, pandas, Spark or ClickHouse without deepspan: [`tables`]
//!   writes them from the analysis results;
//! - `requests.json`: the requests, slowest first, with their top causes
//!   and diagnoses, and the operations, for the UI and scripts ([`json`]);
//! - [`diagnosis`]: a request's diagnosis as the JSON object of the
//!   diagnosis contract (also stored in the `diagnoses` table);
//! - `placements.json`: how each span without deepspan fields was placed
//!   ([`placements`]);
//! - [`report`]: one request read back (critical path, summary) for
//!   `deepspan report`;
//! - `state_history.bin`: every thread's states and every CPU's threads,
//!   queried per thread or CPU and time window without loading the run
//!   ([`history`]).
//!
//! A new analysis is written into a staging folder beside `analysis/` and
//! swapped in only when complete ([`Staging`]), so a reader never sees a
//! half-written analysis and a failed run leaves the previous one intact.

mod chunk;
mod columns;
mod delta;
pub mod diagnosis;
mod error;
pub mod history;
pub mod json;
pub mod kept;
pub mod placements;
pub mod report;
mod rle;
pub mod rows;
mod strings;
pub mod table;
pub mod tables;

use std::path::{Path, PathBuf};

use deepspan_analysis::{
    group_causes, Arch, CauseGroup, Containers, KernelModel, LostEvents, OperationSummary,
    RequestRecord, RequestSummary, SpanIdx, SummaryRow,
};

use deepspan_run::{layout::ANALYSIS_DIR, Run};

pub use error::Error;
pub use report::{read_critical_paths, read_report, Report};

/// What a span is, for tables and reports (the analysis only knows indices).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanMeta {
    pub trace_id: u128,
    pub span_id: u64,
    pub parent_span_id: Option<u64>,
    pub service: String,
    pub operation: String,
    /// OTLP span kind, lower case (`server`, `internal`, …).
    pub kind: &'static str,
}

impl SpanMeta {
    /// `[service] operation`.
    pub fn operation_label(&self) -> String {
        format!("[{}] {}", self.service, self.operation)
    }
}

/// Everything an analysis produced, as the writers need it.
pub struct AnalysisResults<'a> {
    pub model: &'a KernelModel,
    pub arch: Arch,
    pub lost: &'a LostEvents,
    /// Events the trace reader counted as lost (all CPUs).
    pub lost_events: u64,
    /// Kernel events decoded.
    pub events: u64,
    /// The kernel trace, relative to the run folder.
    pub trace_file: &'a str,
    /// Indexed by [`SpanIdx`].
    pub spans: &'a [SpanMeta],
    /// One per request (their critical paths are written as they are
    /// computed, by [`tables::CriticalPathWriter`]).
    pub requests: &'a [RequestRecord],
    pub operations: &'a [OperationSummary<(String, String)>],
    /// The container of each process that ran in one.
    pub containers: &'a Containers,
    /// Things the user should know (spans left out, clock precision, …).
    pub notes: &'a [String],
}

impl AnalysisResults<'_> {
    fn span(&self, idx: SpanIdx) -> Option<&SpanMeta> {
        self.spans.get(idx as usize)
    }
}

/// A cause of a request's time, as reports show it: `[tid/comm] STATE`,
/// `[tid/comm] PREEMPTED (throttled: CPU idle)`, `blocked by request …`.
pub fn cause_label(row: &SummaryRow, spans: &[SpanMeta]) -> String {
    if let Some(b) = row.blocked_by {
        let who = spans
            .get(b as usize)
            .map(|s| format!("{:016x} ({})", s.span_id, s.operation_label()))
            .unwrap_or_else(|| format!("#{b}"));
        return format!("blocked by request {who}");
    }
    let thread = match (row.tid, row.comm) {
        (Some(t), Some(c)) => format!("[{t}/{c}] "),
        (Some(t), None) => format!("[{t}] "),
        _ => String::new(),
    };
    let mut label = format!("{thread}{}", row.state.name());
    label.push_str(cpu_wait_label(
        row.throttled_ns,
        row.contended_ns,
        row.wakeup_ns,
    ));
    label
}

/// A request's causes with the blocking requests grouped by their
/// `[service] operation` (`deepspan_analysis::group_causes`), largest
/// first.
pub fn cause_groups(summary: &RequestSummary, spans: &[SpanMeta]) -> Vec<CauseGroup<String>> {
    group_causes(summary, |b| {
        spans
            .get(b as usize)
            .map(|s| s.operation_label())
            .unwrap_or_else(|| format!("#{b}"))
    })
}

/// A group as reports show it: its one row's label for the request's own
/// time or a single blocking request, `blocked by 5 requests of [pricing]
/// GET /price` for several.
pub fn cause_group_label(g: &CauseGroup<String>, spans: &[SpanMeta]) -> String {
    match (&g.blocked_by, g.requests.len()) {
        (Some(op), n) if n > 1 => format!("blocked by {n} requests of {op}"),
        _ => g
            .parts
            .first()
            .map(|row| cause_label(row, spans))
            .unwrap_or_default(),
    }
}

/// A group of a request's queue (its time before its span started) as
/// reports show it: `queued behind 3 requests of [node] GET /slow` for
/// time the thread that took the request up spent on other requests, else
/// the group's label.
pub fn queue_group_label(g: &CauseGroup<String>, spans: &[SpanMeta]) -> String {
    match (&g.blocked_by, g.requests.len()) {
        (Some(op), 1) => format!("queued behind 1 request of {op}"),
        (Some(op), n) => format!("queued behind {n} requests of {op}"),
        _ => cause_group_label(g, spans),
    }
}

/// What mostly kept a runnable thread off the CPU, as a label suffix
/// (empty when nothing is known).
pub fn cpu_wait_label(throttled_ns: u64, contended_ns: u64, wakeup_ns: u64) -> &'static str {
    if throttled_ns + contended_ns + wakeup_ns == 0 {
        ""
    } else if throttled_ns >= contended_ns && throttled_ns >= wakeup_ns {
        " (throttled)"
    } else if contended_ns >= wakeup_ns {
        " (other threads ran)"
    } else {
        " (wake-up latency)"
    }
}

/// A staging folder for a new `analysis/`, swapped in by [`Staging::commit`]
/// and removed if dropped uncommitted.
pub struct Staging {
    dir: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staging {
    /// Creates `RUN/.analysis-tmp-<pid>/` (replacing a leftover one).
    pub fn new(run_dir: &Path) -> Result<Staging, Error> {
        let dir = run_dir.join(format!(".{ANALYSIS_DIR}-tmp-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(&dir, "cannot remove the leftover", e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create", e))?;
        Ok(Staging {
            dir,
            target: Run::new(run_dir).analysis_dir(),
            committed: false,
        })
    }

    /// Path of a file in the staging folder.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Replaces `RUN/analysis/` with the staging folder. The old analysis
    /// is moved aside first and removed after, so at every instant the
    /// folder is either the old or the new one.
    pub fn commit(mut self) -> Result<PathBuf, Error> {
        let old = self
            .target
            .with_file_name(format!(".{ANALYSIS_DIR}-old-{}", std::process::id()));
        let had_old = self.target.exists();
        if had_old {
            if old.exists() {
                std::fs::remove_dir_all(&old)
                    .map_err(|e| Error::io(&old, "cannot remove the leftover", e))?;
            }
            std::fs::rename(&self.target, &old).map_err(|e| {
                Error::io(&self.target, "cannot move the previous analysis aside", e)
            })?;
        }
        if let Err(e) = std::fs::rename(&self.dir, &self.target) {
            if had_old {
                // Put the previous analysis back: better old than none.
                let _ = std::fs::rename(&old, &self.target);
            }
            return Err(Error::io(
                &self.target,
                "cannot move the new analysis in place",
                e,
            ));
        }
        self.committed = true;
        if had_old {
            std::fs::remove_dir_all(&old)
                .map_err(|e| Error::io(&old, "cannot remove the previous analysis", e))?;
        }
        Ok(self.target.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Hex of a trace id, as OTLP/W3C write it.
pub fn trace_hex(id: u128) -> String {
    format!("{id:032x}")
}

/// Hex of a span id.
pub fn span_hex(id: u64) -> String {
    format!("{id:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_replaces_the_analysis_whole() {
        let run = tempfile::tempdir().unwrap();
        let s = Staging::new(run.path()).unwrap();
        std::fs::write(s.file("a"), "1").unwrap();
        s.commit().unwrap();
        let s = Staging::new(run.path()).unwrap();
        std::fs::write(s.file("b"), "2").unwrap();
        s.commit().unwrap();
        let names: Vec<String> = std::fs::read_dir(run.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![ANALYSIS_DIR.to_string()]);
        assert!(run.path().join("analysis/b").is_file());
        assert!(!run.path().join("analysis/a").exists());
        // Dropped uncommitted: nothing changes.
        let s = Staging::new(run.path()).unwrap();
        std::fs::write(s.file("c"), "3").unwrap();
        drop(s);
        assert!(!run.path().join("analysis/c").exists());
        assert_eq!(std::fs::read_dir(run.path()).unwrap().count(), 1);
    }

    #[test]
    fn cpu_wait_labels() {
        assert_eq!(cpu_wait_label(0, 0, 0), "");
        assert_eq!(cpu_wait_label(5, 1, 1), " (throttled)");
        assert_eq!(cpu_wait_label(1, 5, 1), " (other threads ran)");
        assert_eq!(cpu_wait_label(1, 1, 5), " (wake-up latency)");
    }
}
