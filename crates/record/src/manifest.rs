//! `RUN/manifest.json`: what was recorded, how, and the clock samples that
//! map span wall-clock times onto the kernel's monotonic time base.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

pub const MANIFEST_FILE: &str = "manifest.json";
pub const FORMAT_VERSION: u32 = 1;

/// The description of a run folder, written by the recorder and read by
/// every later stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub host: String,
    pub kernel_release: String,
    pub cpus: usize,
    /// Ring-buffer page size of the kernel trace, bytes.
    pub page_size: u32,
    /// Kernel trace clock; always `mono` for deepspan recordings.
    pub trace_clock: String,
    /// Enabled events as `system:name`.
    pub events: Vec<String>,
    /// `standard` or `flight`.
    pub mode: String,
    pub buffer_kb_per_cpu: u64,
    /// Only these pids (and their descendants) were traced; empty = all.
    #[serde(default)]
    pub pids: Vec<i32>,
    pub start: ClockPoint,
    pub end: ClockPoint,
    /// `[realtime_ns, mono_ns]` pairs taken at start, every second, and at
    /// the end, for mapping wall-clock span times onto kernel time.
    pub clock_samples: Vec<[u64; 2]>,
    pub per_cpu: Vec<CpuManifest>,
    /// Events the kernel could not keep (see [`CpuManifest`]); analyses
    /// carry this number into their results.
    pub lost_events: u64,
    /// The kernel trace (trace.dat v6), relative to the run folder; None if
    /// none could be written.
    pub kernel_trace: Option<String>,
    #[serde(default)]
    pub snapshots: Vec<Snapshot>,
    pub otlp: OtlpPorts,
    #[serde(default)]
    pub command: Vec<String>,
    /// Exit status of the command (128+signal if it was killed); None
    /// without a command or if it outlived the recording.
    pub exit_code: Option<i32>,
    /// Thread id → thread-group id lines (`pid tgid`) relative to the run folder.
    #[serde(default)]
    pub tgids: Option<String>,
    /// The /proc scan (`processes.json`) relative to the run folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<String>,
    /// Non-fatal problems met while recording.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The recorder's own threads, left out of the trace. The kernel also
    /// drops the interrupt events that run while one of them is current,
    /// but keeps the wake-ups those interrupts cause: the analysis must not
    /// take such a wake-up for the recorder's doing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recorder_tids: Vec<i32>,
    /// CPU samples taken with the trace (`record --profile`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileManifest>,
    /// `/proc/sys/kernel/random/boot_id` when recording started: runs with
    /// the same boot id were recorded on one kernel, so they share its
    /// CLOCK_MONOTONIC and, when recorded with a pid filter, the scheduler
    /// events between their threads (a merged analysis then gives each
    /// thread to the run that traced it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The TCP segments recorded with `--tcp-keys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keys: Option<crate::TcpKeysManifest>,
    /// When CPU cgroup quotas held threads back; None when this kernel or
    /// build could not say (a warning says why), or in flight mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfs_throttle: Option<crate::ThrottleManifest>,
}

/// What `record --profile` sampled (`deepspan_profile::Sampler`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileManifest {
    /// The folder of samples and symbol sources, relative to the run folder.
    pub dir: String,
    pub hz: u64,
    pub samples: u64,
    /// Samples the kernel could not store.
    pub lost: u64,
    pub processes: u64,
}

/// Both clocks at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPoint {
    pub realtime_ns: u64,
    pub mono_ns: u64,
}

/// Ring-buffer statistics of one CPU at the end (`per_cpu/cpuN/stats`),
/// plus what the recorder wrote.
///
/// `overrun`: events overwritten before being read (in flight mode that is
/// the ring doing its job); `commit_overrun` and `dropped_events`: events
/// the kernel could not store at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuManifest {
    pub cpu: usize,
    pub entries: u64,
    pub overrun: u64,
    pub commit_overrun: u64,
    pub dropped_events: u64,
    pub read_events: u64,
    /// Bytes still in the kernel buffer at the end.
    pub buffer_bytes: u64,
    /// Bytes of ring-buffer pages written to the kernel trace.
    pub bytes: u64,
}

/// A flight-recorder snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// trace.dat file relative to the run folder.
    pub file: String,
    /// When it was requested.
    pub realtime_ns: u64,
    pub mono_ns: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OtlpPorts {
    pub grpc_port: u16,
    pub http_port: u16,
    /// The receiver's counters (requests, spans written/dropped, …), kept
    /// verbatim so that re-saving a manifest never loses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<serde_json::Value>,
}

impl Manifest {
    /// Reads `run_dir/manifest.json`.
    pub fn load(run_dir: &Path) -> Result<Manifest, Error> {
        let path = run_dir.join(MANIFEST_FILE);
        let text = std::fs::read(&path).map_err(|e| Error::Manifest {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| Error::Manifest {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if manifest.format_version > FORMAT_VERSION {
            return Err(Error::Manifest {
                path,
                reason: format!(
                    "format version {} is newer than this deepspan understands ({FORMAT_VERSION})",
                    manifest.format_version
                ),
            });
        }
        Ok(manifest)
    }

    /// Writes `run_dir/manifest.json` (through a temporary file, so a reader
    /// never sees half of it).
    pub fn save(&self, run_dir: &Path) -> Result<PathBuf, Error> {
        let path = run_dir.join(MANIFEST_FILE);
        let tmp = run_dir.join(format!("{MANIFEST_FILE}.partial"));
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::io("encode", &path, std::io::Error::other(e)))?;
        std::fs::write(&tmp, text).map_err(|e| Error::output("write", &tmp, run_dir, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io("write", &path, e))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json() {
        let m = Manifest {
            format_version: FORMAT_VERSION,
            host: "h".into(),
            kernel_release: "6.18".into(),
            cpus: 2,
            page_size: 4096,
            trace_clock: "mono".into(),
            events: vec!["sched:sched_switch".into()],
            mode: "standard".into(),
            buffer_kb_per_cpu: 4096,
            pids: vec![],
            start: ClockPoint {
                realtime_ns: 1,
                mono_ns: 2,
            },
            end: ClockPoint {
                realtime_ns: 3,
                mono_ns: 4,
            },
            clock_samples: vec![[1, 2], [3, 4]],
            per_cpu: vec![CpuManifest {
                cpu: 0,
                ..Default::default()
            }],
            lost_events: 0,
            kernel_trace: Some("kernel/trace.dat".into()),
            snapshots: vec![],
            otlp: OtlpPorts {
                grpc_port: 4317,
                http_port: 4318,
                receiver: None,
            },
            command: vec!["true".into()],
            exit_code: Some(0),
            tgids: None,
            processes: None,
            recorder_tids: Vec::new(),
            profile: None,
            warnings: vec![],
            boot_id: Some("0b1e3c2a-5f7d-4e38-9a51-6c2d8e4f1a07".into()),
            tcp_keys: None,
            cfs_throttle: None,
        };
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST_FILE)).unwrap())
                .unwrap();
        assert_eq!(v["clock_samples"][1][0], 3);
        assert_eq!(v["otlp"]["http_port"], 4318);
        assert_eq!(v["boot_id"], "0b1e3c2a-5f7d-4e38-9a51-6c2d8e4f1a07");
    }

    #[test]
    fn a_manifest_without_boot_id_reads_and_writes_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut doc = serde_json::json!({
            "format_version": 1, "host": "h", "kernel_release": "6.1", "cpus": 1, "page_size": 4096,
            "trace_clock": "mono", "events": [], "mode": "standard", "buffer_kb_per_cpu": 1024,
            "start": {"realtime_ns": 1, "mono_ns": 2}, "end": {"realtime_ns": 3, "mono_ns": 4},
            "clock_samples": [], "per_cpu": [], "lost_events": 0, "kernel_trace": null,
            "otlp": {"grpc_port": 1, "http_port": 2}, "exit_code": null
        });
        std::fs::write(dir.path().join(MANIFEST_FILE), doc.to_string()).unwrap();
        let m = Manifest::load(dir.path()).unwrap();
        assert_eq!(m.boot_id, None);
        m.save(dir.path()).unwrap();
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST_FILE)).unwrap())
                .unwrap();
        assert!(back.get("boot_id").is_none(), "{back}");
        doc["boot_id"] = "b".into();
        std::fs::write(dir.path().join(MANIFEST_FILE), doc.to_string()).unwrap();
        assert_eq!(
            Manifest::load(dir.path()).unwrap().boot_id.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn missing_manifest_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Manifest::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("manifest.json"), "{err}");
    }
}
