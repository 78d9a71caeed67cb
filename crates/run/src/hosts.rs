//! `RUN/hosts.json`: the hosts of a merged run and the clock that maps each
//! host's times onto the reference host's. Written by the merge
//! (`deepspan_pipeline::hosts::merge_runs`), read by the analysis and the UI
//! server as this one type.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// `hosts.json`: the hosts of a merged run and their clocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostsFile {
    /// Index into `hosts` of the host whose clock is the merged run's.
    pub reference: usize,
    pub hosts: Vec<HostEntry>,
}

/// One host of a merged run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostEntry {
    /// The host name (the run manifest's `host`).
    pub host: String,
    /// The host's run folder (absolute).
    pub run: PathBuf,
    /// The host's clock onto the reference's: `slope · t + offset_ns`.
    pub slope: f64,
    pub offset_ns: f64,
    /// `deepspan sync`'s quality of that transform.
    pub quality: String,
    /// The most a mapped time of the host's run can be off, in ns, from
    /// the bounds of every clock that fits the messages (`deepspan sync`'s
    /// max error); absent when nothing bounds it (and in files written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_ns: Option<f64>,
    /// Messages matched with the host it was aligned through.
    pub matched: u64,
    /// The host's first CPU number in the merged model.
    pub cpu_base: u32,
    /// The host's CPUs.
    pub cpus: u32,
    /// The kernel boot the run was recorded in, when its manifest says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The processes the run was limited to (`record --pid`), empty for a
    /// system-wide run.
    #[serde(default)]
    pub pids: Vec<i32>,
}

/// A `hosts.json` that cannot be read or is not a merged run's: which file,
/// and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct HostsError {
    pub path: PathBuf,
    pub reason: String,
}

impl HostsFile {
    /// Reads `run_dir/hosts.json`; None when the run has none (a run of
    /// one host).
    pub fn load(run_dir: &Path) -> Result<Option<HostsFile>, HostsError> {
        let path = crate::Run::new(run_dir).hosts();
        match std::fs::read(&path) {
            Ok(bytes) => HostsFile::parse(&bytes, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HostsError {
                path,
                reason: format!("cannot read it: {e}"),
            }),
        }
    }

    /// A `hosts.json` read from `path` (for the error) by a reader that
    /// opens the file its own way: at least one host, and the reference is
    /// one of them.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<HostsFile, HostsError> {
        let bad = |reason: String| HostsError {
            path: path.to_path_buf(),
            reason,
        };
        let file: HostsFile = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a merged run's list of hosts: {e}")))?;
        if file.hosts.is_empty() {
            return Err(bad("no hosts".into()));
        }
        if file.reference >= file.hosts.len() {
            return Err(bad(format!(
                "reference {} is not one of its {} hosts",
                file.reference,
                file.hosts.len()
            )));
        }
        Ok(file)
    }

    /// Writes `run_dir/hosts.json`.
    pub fn save(&self, run_dir: &Path) -> Result<PathBuf, std::io::Error> {
        let path = crate::Run::new(run_dir).hosts();
        std::fs::write(&path, serde_json::to_vec_pretty(self).expect("plain data"))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, max_error_ns: Option<f64>) -> HostEntry {
        HostEntry {
            host: host.into(),
            run: PathBuf::from("/runs").join(host),
            slope: 1.000_001,
            offset_ns: -2_500.0,
            quality: "accurate".into(),
            matched: 40,
            max_error_ns,
            cpu_base: 0,
            cpus: 2,
            boot_id: None,
            pids: Vec::new(),
        }
    }

    #[test]
    fn a_saved_file_loads_as_it_was_and_an_unbounded_clock_has_no_key() {
        let dir = tempfile::tempdir().unwrap();
        assert!(HostsFile::load(dir.path()).unwrap().is_none());
        let file = HostsFile {
            reference: 1,
            hosts: vec![entry("a", Some(12_345.6)), entry("b", None)],
        };
        let path = file.save(dir.path()).unwrap();
        assert_eq!(HostsFile::load(dir.path()).unwrap(), Some(file));
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(text.matches("max_error_ns").count(), 1, "{text}");
    }

    #[test]
    fn a_file_that_is_no_merged_run_says_why_and_where() {
        let path = Path::new("/runs/m/hosts.json");
        let no_hosts = HostsFile::parse(br#"{"reference": 0, "hosts": []}"#, path).unwrap_err();
        assert_eq!(no_hosts.to_string(), "/runs/m/hosts.json: no hosts");
        let one = serde_json::to_vec(&HostsFile {
            reference: 1,
            hosts: vec![entry("a", None)],
        })
        .unwrap();
        let outside = HostsFile::parse(&one, path).unwrap_err();
        assert!(
            outside
                .reason
                .contains("reference 1 is not one of its 1 hosts"),
            "{outside}"
        );
        let not_json = HostsFile::parse(b"[1, 2]", path).unwrap_err();
        assert!(
            not_json
                .reason
                .starts_with("not a merged run's list of hosts"),
            "{not_json}"
        );
    }
}
