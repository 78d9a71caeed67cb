//! `RUN/analysis/placements.json`: how each span without deepspan fields
//! was placed on a thread or a process, with its evidence. Written by the
//! analysis, read back by `deepspan report` and the UI server as the same
//! types.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;

/// One span's placement. The fields are in the file's key order
/// (alphabetical, as the first version wrote them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementRecord {
    /// 0 to 1, rounded to 3 decimals.
    pub confidence: f64,
    /// Why there, in sentences.
    pub evidence: Vec<String>,
    pub pid: i32,
    /// 16 hex digits.
    pub span_id: String,
    /// `inferred` (on a thread) or `process`.
    pub sync: String,
    /// The thread, when placed on one.
    pub tid: Option<i32>,
    /// 32 hex digits.
    pub trace_id: String,
}

/// The whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PlacementsDoc {
    pub placements: Vec<PlacementRecord>,
}

/// Writes `placements.json` at `path`, compact as `requests.json`
/// (indented, it took 440 bytes a span; `jq .` shows it indented).
pub fn write_placements_json(path: &Path, doc: &PlacementsDoc) -> Result<(), Error> {
    let mut text = serde_json::to_vec(doc).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        at: None,
        source,
    })?;
    text.push(b'\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, "cannot write", e))
}

/// Reads the `placements.json` at `path`.
pub fn read_placements_json(path: &Path) -> Result<PlacementsDoc, Error> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "cannot read", e))?;
    crate::json::parse_json_file(&bytes, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_placements_read_back_equal_and_bad_ones_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("placements.json");
        let doc = PlacementsDoc {
            placements: vec![
                PlacementRecord {
                    trace_id: "0".repeat(31) + "1",
                    span_id: "0".repeat(15) + "2",
                    sync: "inferred".into(),
                    pid: 10,
                    tid: Some(11),
                    confidence: 0.875,
                    evidence: vec!["ran at the span's start".into()],
                },
                PlacementRecord {
                    trace_id: "0".repeat(31) + "3",
                    span_id: "0".repeat(15) + "4",
                    sync: "process".into(),
                    pid: 10,
                    tid: None,
                    confidence: 0.5,
                    evidence: vec![],
                },
            ],
        };
        write_placements_json(&path, &doc).unwrap();
        assert_eq!(
            read_placements_json(&path).unwrap().placements,
            doc.placements
        );

        std::fs::write(&path, r#"{"placements": [{"span_id": 3}]}"#).unwrap();
        let err = read_placements_json(&path).unwrap_err().to_string();
        assert!(
            err.contains("placements.json") && err.contains("invalid JSON"),
            "{err}"
        );
    }
}
