//! `RUN/manifest.json`: what was recorded, how, and the clock samples that
//! map span wall-clock times onto the kernel's monotonic time base.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::MANIFEST;

/// The manifest format this deepspan writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// A manifest that could not be read or written: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read the run manifest {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    /// The I/O error is kept: a recorder tells a full disk from the rest.
    #[error("cannot write the run manifest {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The description of a run folder, written by the recorder and read by
/// every later stage. A run of spans only ([`Manifest::spans_only`]) has
/// none of the kernel trace's fields: they read as empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub host: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_release: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpus: usize,
    /// Ring-buffer page size of the kernel trace, bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub page_size: u32,
    /// Kernel trace clock; always `mono` for deepspan recordings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trace_clock: String,
    /// Enabled events as `system:name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// `standard`, `flight`, or `receive` (spans only).
    pub mode: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub buffer_kb_per_cpu: u64,
    /// Only these pids (and their descendants) were traced; empty = all.
    #[serde(default)]
    pub pids: Vec<i32>,
    pub start: ClockPoint,
    pub end: ClockPoint,
    /// `[realtime_ns, mono_ns]` pairs taken at start, every second, and at
    /// the end, for mapping wall-clock span times onto kernel time.
    pub clock_samples: Vec<[u64; 2]>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_cpu: Vec<CpuManifest>,
    /// Events the kernel could not keep (see [`CpuManifest`]); analyses
    /// carry this number into their results.
    #[serde(default)]
    pub lost_events: u64,
    /// The kernel trace (trace.dat v6), relative to the run folder; None if
    /// none could be written.
    #[serde(default)]
    pub kernel_trace: Option<String>,
    #[serde(default)]
    pub snapshots: Vec<Snapshot>,
    pub otlp: OtlpPorts,
    #[serde(default)]
    pub command: Vec<String>,
    /// Exit status of the command (128+signal if it was killed); None
    /// without a command or if it outlived the recording.
    #[serde(default)]
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
    pub tcp_keys: Option<TcpKeysManifest>,
    /// When CPU cgroup quotas held threads back; None when this kernel or
    /// build could not say (a warning says why), or in flight mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfs_throttle: Option<ThrottleManifest>,
    /// Each sleep of a thread inside a system call, with the call; None
    /// when this kernel, architecture or build could not say (a warning
    /// says why), or for runs recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_syscalls: Option<BlockedSyscallsManifest>,
    /// Each socket receive that returned data and each socket send, with
    /// its bytes; None when this kernel or build could not say (a warning
    /// says why), or for runs recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_calls: Option<SocketCallsManifest>,
    /// Each switch of an idle CPU to a thread (ftrace loses many of them);
    /// None when this kernel or build could not say (a warning says why),
    /// or for runs recorded before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_switches: Option<CaptureManifest>,
    /// A merged run's hosts and clocks (`hosts.json`), relative to the run
    /// folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<String>,
}

/// `run_dir/manifest.json` read as `T` (the whole manifest or a section).
fn read_manifest_as<T: serde::de::DeserializeOwned>(run_dir: &Path) -> Result<T, ManifestError> {
    let path = run_dir.join(MANIFEST);
    let bad = |reason: String| ManifestError::Read {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// What `record --profile` sampled (`deepspan_profile::Sampler`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileManifest {
    /// The folder of samples and symbol sources, relative to the run folder.
    pub dir: String,
    #[serde(default)]
    pub hz: u64,
    #[serde(default)]
    pub samples: u64,
    /// Samples the kernel could not store.
    #[serde(default)]
    pub lost: u64,
    #[serde(default)]
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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OtlpPorts {
    pub grpc_port: u16,
    pub http_port: u16,
    /// The receiver's counters (requests, spans written/dropped, …), kept
    /// verbatim so that re-saving a manifest never loses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<serde_json::Value>,
}

/// What the manifest says of a run's segments (`tcp_keys`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TcpKeysManifest {
    /// The segments file, relative to the run folder.
    pub file: String,
    /// Segments written.
    pub segments: u64,
    /// Segments of other network namespaces, left out (`--pid` runs).
    pub other_netns: u64,
    /// Segments the eBPF ring buffer had no room for.
    pub lost: u64,
    /// The network namespaces kept (inodes); empty: all.
    #[serde(default)]
    pub netns: Vec<u64>,
}

/// What the manifest says of a run's throttling file (`cfs_throttle`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThrottleManifest {
    /// The throttling file, relative to the run folder.
    pub file: String,
    /// Switch-outs written.
    pub switches: u64,
    /// Switch-outs the eBPF ring buffer had no room for.
    pub lost: u64,
}

/// What the manifest says of a file of one of the recorder's eBPF
/// captures (`blocked_syscalls`, `socket_calls`, `idle_switches`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaptureManifest {
    /// The file, relative to the run folder.
    pub file: String,
    /// Records written.
    pub records: u64,
    /// Records the eBPF ring buffer had no room for.
    pub lost: u64,
}

/// The blocked-syscall file's section (`blocked_syscalls`): its records
/// are sleeps in system calls.
pub type BlockedSyscallsManifest = CaptureManifest;

/// The socket-call file's section (`socket_calls`): its records are
/// calls.
pub type SocketCallsManifest = CaptureManifest;

impl Manifest {
    /// The manifest of a run that holds spans only (`deepspan receive`):
    /// the clock samples that map their wall times onto CLOCK_MONOTONIC,
    /// the receiver's ports and counters, and no kernel trace.
    pub fn spans_only(host: String, clock_samples: Vec<[u64; 2]>, otlp: OtlpPorts) -> Manifest {
        let point = |s: Option<&[u64; 2]>| {
            s.map_or(ClockPoint::default(), |&[realtime_ns, mono_ns]| {
                ClockPoint {
                    realtime_ns,
                    mono_ns,
                }
            })
        };
        Manifest {
            format_version: FORMAT_VERSION,
            host,
            mode: "receive".into(),
            start: point(clock_samples.first()),
            end: point(clock_samples.last()),
            clock_samples,
            otlp,
            ..Manifest::default()
        }
    }

    /// Reads `run_dir/manifest.json`.
    pub fn load(run_dir: &Path) -> Result<Manifest, ManifestError> {
        let manifest: Manifest = read_manifest_as(run_dir)?;
        if manifest.format_version > FORMAT_VERSION {
            return Err(ManifestError::Read {
                path: run_dir.join(MANIFEST),
                reason: format!(
                    "format version {} is newer than this deepspan understands ({FORMAT_VERSION})",
                    manifest.format_version
                ),
            });
        }
        Ok(manifest)
    }

    /// The `profile` section of `run_dir/manifest.json` alone (`None`:
    /// recorded without `--profile`), for a reader that needs nothing else
    /// and should not fail on the rest of a manifest.
    pub fn load_profile(run_dir: &Path) -> Result<Option<ProfileManifest>, ManifestError> {
        #[derive(Deserialize)]
        struct ProfileOnly {
            #[serde(default)]
            profile: Option<ProfileManifest>,
        }
        Ok(read_manifest_as::<ProfileOnly>(run_dir)?.profile)
    }

    /// The `host` of `run_dir/manifest.json` alone (`None`: not named), so
    /// that the minimal manifest of a spans-only run will do; a host that
    /// is named must be a non-empty string.
    pub fn load_host(run_dir: &Path) -> Result<Option<String>, ManifestError> {
        #[derive(Deserialize)]
        struct HostOnly {
            #[serde(default)]
            host: Option<String>,
        }
        let path = run_dir.join(MANIFEST);
        let bad = |reason: String| ManifestError::Read {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let host = match serde_json::from_slice::<HostOnly>(&text) {
            Ok(HostOnly { host }) => host,
            Err(e) if e.classify() == serde_json::error::Category::Data => {
                return Err(bad(format!("\"host\" must be a non-empty string: {e}")))
            }
            Err(e) => return Err(bad(format!("not JSON: {e}"))),
        };
        match host {
            Some(h) if h.is_empty() => Err(bad("\"host\" must be a non-empty string".into())),
            host => Ok(host),
        }
    }

    /// Writes `run_dir/manifest.json`.
    pub fn save(&self, run_dir: &Path) -> Result<PathBuf, ManifestError> {
        write_atomically(run_dir, self)
    }

    /// Replaces (or adds) one top-level section of `run_dir/manifest.json`,
    /// keeping every other key, its value and its place as they are: a stage
    /// that owns one section (the OTLP receiver its `otlp`) never rewrites
    /// the recorder's, even those this deepspan does not know.
    pub fn patch_section(
        run_dir: &Path,
        key: &str,
        value: &impl Serialize,
    ) -> Result<PathBuf, ManifestError> {
        let path = run_dir.join(MANIFEST);
        let bad = |reason: String| ManifestError::Read {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let mut object: OrderedObject =
            serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        let value = serde_json::to_value(value).expect("plain data");
        match object.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => object.0.push((key.to_string(), value)),
        }
        write_atomically(run_dir, &object)
    }
}

/// Through a temporary file, so a reader never sees half a manifest.
fn write_atomically(run_dir: &Path, manifest: &impl Serialize) -> Result<PathBuf, ManifestError> {
    let path = run_dir.join(MANIFEST);
    let tmp = run_dir.join(format!("{MANIFEST}.partial"));
    let mut text = serde_json::to_vec_pretty(manifest).expect("plain data");
    text.push(b'\n');
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
    written.map_err(|source| ManifestError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// A JSON object whose top-level keys keep their order (serde_json's map
/// sorts them, and its order-keeping feature would change every map of the
/// workspace).
struct OrderedObject(Vec<(String, serde_json::Value)>);

impl Serialize for OrderedObject {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OrderedObject, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, serde_json::Value>()? {
                    entries.push(entry);
                }
                Ok(OrderedObject(entries))
            }
        }
        d.deserialize_map(Entries)
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
            blocked_syscalls: Some(BlockedSyscallsManifest {
                file: "kernel/blocked_syscalls.tsv".into(),
                records: 12,
                lost: 1,
            }),
            socket_calls: Some(SocketCallsManifest {
                file: "kernel/socket_calls.tsv".into(),
                records: 30,
                lost: 0,
            }),
            idle_switches: Some(CaptureManifest {
                file: "kernel/idle_switches.tsv".into(),
                records: 7,
                lost: 0,
            }),
            hosts: None,
        };
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path()).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(v["clock_samples"][1][0], 3);
        assert_eq!(v["otlp"]["http_port"], 4318);
        assert_eq!(v["boot_id"], "0b1e3c2a-5f7d-4e38-9a51-6c2d8e4f1a07");
        assert_eq!(v["blocked_syscalls"]["records"], 12);
        assert_eq!(v["socket_calls"]["records"], 30);
        assert_eq!(v["idle_switches"]["records"], 7);
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
        std::fs::write(dir.path().join(MANIFEST), doc.to_string()).unwrap();
        let m = Manifest::load(dir.path()).unwrap();
        assert_eq!(m.boot_id, None);
        // Nor the sections added since.
        assert_eq!(m.blocked_syscalls, None);
        assert_eq!(m.socket_calls, None);
        assert_eq!(m.idle_switches, None);
        m.save(dir.path()).unwrap();
        let back: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
        assert!(back.get("boot_id").is_none(), "{back}");
        assert!(back.get("blocked_syscalls").is_none(), "{back}");
        assert!(back.get("socket_calls").is_none(), "{back}");
        assert!(back.get("idle_switches").is_none(), "{back}");
        doc["boot_id"] = "b".into();
        std::fs::write(dir.path().join(MANIFEST), doc.to_string()).unwrap();
        assert_eq!(
            Manifest::load(dir.path()).unwrap().boot_id.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn the_profile_section_reads_alone_from_any_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: &str| std::fs::write(dir.path().join(MANIFEST), text).unwrap();
        write(r#"{"host": "a manifest of another shape"}"#);
        assert_eq!(Manifest::load_profile(dir.path()).unwrap(), None);
        write(
            r#"{"profile": {"dir": "profile", "hz": 99, "samples": 7, "lost": 1, "processes": 2}}"#,
        );
        let p = Manifest::load_profile(dir.path()).unwrap().unwrap();
        assert_eq!(
            (p.dir.as_str(), p.hz, p.samples, p.lost, p.processes),
            ("profile", 99, 7, 1, 2)
        );
        write(r#"{"profile": {"hz": 99}}"#);
        let err = Manifest::load_profile(dir.path()).unwrap_err().to_string();
        assert!(err.contains("missing field `dir`"), "{err}");
    }

    #[test]
    fn the_host_reads_alone_and_must_be_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: &str| std::fs::write(dir.path().join(MANIFEST), text).unwrap();
        let host = || Manifest::load_host(dir.path());
        write(r#"{"host": "alpha", "cpus": "not a number"}"#);
        assert_eq!(host().unwrap().as_deref(), Some("alpha"));
        write(r#"{"otlp": {}}"#);
        assert_eq!(host().unwrap(), None);
        for bad in [r#"{"host": 3}"#, r#"{"host": ""}"#] {
            write(bad);
            let err = host().unwrap_err().to_string();
            assert!(
                err.contains("manifest.json")
                    && err.contains("\"host\" must be a non-empty string"),
                "{bad}: {err}"
            );
        }
        write("{\"host\": ");
        assert!(host().unwrap_err().to_string().contains("not JSON"));
    }

    #[test]
    fn missing_manifest_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = Manifest::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("manifest.json"), "{err}");
    }

    #[test]
    fn patching_a_section_keeps_every_other_key_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let original = r#"{"format_version": 1, "zeta": {"b": 1, "a": [1, 2]}, "otlp": {"grpc_port": 1}, "alpha": true}"#;
        std::fs::write(dir.path().join(MANIFEST), original).unwrap();
        let otlp = OtlpPorts {
            grpc_port: 7,
            http_port: 8,
            receiver: None,
        };
        Manifest::patch_section(dir.path(), "otlp", &otlp).unwrap();
        Manifest::patch_section(dir.path(), "added", &3).unwrap();
        let text = std::fs::read_to_string(dir.path().join(MANIFEST)).unwrap();
        let keys = ["format_version", "zeta", "\"b\"", "otlp", "alpha", "added"];
        let at: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(at.is_sorted(), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["otlp"]["http_port"], 8);
        assert_eq!(v["zeta"]["a"][1], 2);
    }

    #[test]
    fn a_spans_only_manifest_reads_back_without_kernel_fields() {
        let dir = tempfile::tempdir().unwrap();
        let m = Manifest::spans_only("h".into(), vec![[10, 1], [20, 2]], OtlpPorts::default());
        m.save(dir.path()).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
        for absent in ["kernel_release", "cpus", "events", "per_cpu"] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        assert_eq!(v["mode"], "receive");
        assert_eq!(v["end"]["mono_ns"], 2);
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);
    }
}
