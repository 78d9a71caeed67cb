//! `RUN/snapshot.json`: when the live agent took a snapshot, over which
//! window, for which anomalous spans, and whether its analysis succeeded.
//! Written by the agent (`deepspan_agent::snapshot`), read by `deepspan ui`
//! over a folder of snapshots, both as [`SnapshotInfo`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The description of one agent snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// The id the agent gave it (its folder's name when it was written).
    pub id: String,
    /// When it was taken, on the wall clock.
    pub taken_unix_ns: u64,
    /// The kernel window it holds, on the monotonic clock: [start, end].
    pub window_mono_ns: [u64; 2],
    pub status: SnapshotStatus,
    /// Why the analysis failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Spans of the window's requests left out of its span file (over the
    /// agent's `max_spans`), so that an analysis stays bounded on a busy
    /// host.
    #[serde(default)]
    pub spans_left_out: u64,
    /// The anomalous spans that made the agent take it.
    #[serde(default)]
    pub triggers: Vec<SnapshotTrigger>,
}

/// Whether a snapshot's analysis succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStatus {
    Analysed,
    Failed,
}

impl SnapshotStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotStatus::Analysed => "analysed",
            SnapshotStatus::Failed => "failed",
        }
    }
}

/// An anomalous span that triggered a snapshot, with what its analysis said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotTrigger {
    /// Hexadecimal, as OTLP/JSON writes it.
    pub trace_id: String,
    pub span_id: String,
    pub service: String,
    pub operation: String,
    pub duration_ns: u64,
    /// The operation's usual duration when the span came.
    #[serde(default)]
    pub baseline_ns: Option<u64>,
    /// `deepspan.cause` and `deepspan.headline` of its diagnosis.
    #[serde(default)]
    pub cause: Option<String>,
    #[serde(default)]
    pub headline: Option<String>,
}

/// A `snapshot.json` that cannot be read or written: which file, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct SnapshotError {
    pub path: PathBuf,
    pub reason: String,
}

impl SnapshotInfo {
    /// Reads `run_dir/snapshot.json`.
    pub fn load(run_dir: &Path) -> Result<SnapshotInfo, SnapshotError> {
        let path = crate::Run::new(run_dir).snapshot();
        let bad = |reason: String| SnapshotError {
            path: path.clone(),
            reason,
        };
        let bytes = std::fs::read(&path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not an agent snapshot's description: {e}")))
    }

    /// Writes `run_dir/snapshot.json`.
    pub fn save(&self, run_dir: &Path) -> Result<PathBuf, SnapshotError> {
        let path = crate::Run::new(run_dir).snapshot();
        let text = serde_json::to_vec_pretty(self).expect("plain data");
        std::fs::write(&path, text).map_err(|e| SnapshotError {
            path: path.clone(),
            reason: format!("cannot write it: {e}"),
        })?;
        Ok(path)
    }

    /// The window's length.
    pub fn window_ns(&self) -> u64 {
        self.window_mono_ns[1].saturating_sub(self.window_mono_ns[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_snapshot_loads_as_it_was_and_an_older_one_without_new_keys_loads() {
        let dir = tempfile::tempdir().unwrap();
        let info = SnapshotInfo {
            id: "20261125T071500.123Z-0001".into(),
            taken_unix_ns: 1_764_054_900_123_000_000,
            window_mono_ns: [1_000, 250_001_000],
            status: SnapshotStatus::Analysed,
            error: None,
            spans_left_out: 3,
            triggers: vec![SnapshotTrigger {
                trace_id: "0".repeat(32),
                span_id: "1".repeat(16),
                service: "pricing".into(),
                operation: "GET /price".into(),
                duration_ns: 123,
                baseline_ns: Some(40),
                cause: Some("cpu_throttled".into()),
                headline: None,
            }],
        };
        info.save(dir.path()).unwrap();
        assert_eq!(SnapshotInfo::load(dir.path()).unwrap(), info);
        assert_eq!(info.window_ns(), 250_000_000);

        std::fs::write(
            crate::Run::new(dir.path()).snapshot(),
            r#"{"id": "x", "taken_unix_ns": 5, "window_mono_ns": [5, 9], "status": "failed"}"#,
        )
        .unwrap();
        let old = SnapshotInfo::load(dir.path()).unwrap();
        assert_eq!(old.status, SnapshotStatus::Failed);
        assert!(old.triggers.is_empty() && old.error.is_none() && old.spans_left_out == 0);
    }

    #[test]
    fn an_unreadable_snapshot_says_which_file_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let missing = SnapshotInfo::load(dir.path()).unwrap_err();
        assert!(missing.reason.starts_with("cannot read it"), "{missing}");
        std::fs::write(
            crate::Run::new(dir.path()).snapshot(),
            r#"{"status": "lost"}"#,
        )
        .unwrap();
        let bad = SnapshotInfo::load(dir.path()).unwrap_err();
        assert!(
            bad.to_string()
                .contains("snapshot.json: not an agent snapshot"),
            "{bad}"
        );
    }
}
