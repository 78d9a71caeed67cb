//! The run folder: where each of its files lives, and the files that
//! describe it (the manifest, a merged run's hosts, an agent snapshot's
//! description).
//!
//! A run folder is what `deepspan record`, `receive`, `import-ctf`, a merge
//! of hosts and the agent's snapshots write, and what every later stage
//! reads. [`Run`] is the one place that spells its layout:
//!
//! ```text
//! RUN/
//!   manifest.json               what was recorded, and the clock samples (Manifest)
//!   processes.json              the /proc scan (deepspan-record)
//!   hosts.json                  a merged run's hosts and clocks (HostsFile)
//!   snapshot.json               an agent snapshot's window and triggers (SnapshotInfo)
//!   kernel/trace.dat            the kernel trace, trace-cmd's format v6
//!   kernel/saved_tgids          thread → process lines
//!   kernel/cpuN.raw             one CPU's pages, kept when trace.dat could not be written
//!   kernel/ctf/                 an imported LTTng trace
//!   kernel/journal/             a recording in progress (deepspan-record)
//!   kernel/snapshots/NNN.dat    flight-recorder snapshots of a recording
//!   kernel/tcp_segments.tsv     `record --tcp-keys`
//!   kernel/cfs_throttle.tsv     CPU-quota switch-outs
//!   kernel/blocked_syscalls.tsv sleeps in system calls: number, first arguments, bytes read so far
//!   kernel/socket_calls.tsv     socket receives' returns and sends' starts, with bytes
//!   kernel/idle_switches.tsv    idle CPUs' switches to a thread (ftrace loses many)
//!   spans/                      OTLP span files (deepspan-spans)
//!   profile/                    CPU samples (deepspan-profile)
//!   analysis/                   what `deepspan analyze` wrote (see [`analysis`])
//!   demo/                       a demo scenario's expectations and log
//! ```
//!
//! The insides of `spans/`, `profile/` and `kernel/journal/` are named here
//! too ([`Run::span_file`], [`profile`], [`journal`]); what each file holds
//! belongs to the crate whose format it is. The manifest records the
//! relative paths in [`layout`], so a run folder can be moved.
//!
//! Invariant: no other crate of the workspace spells a run-folder file
//! name; tests, `bench/`, the UI and `docs/tables.md` (the public contract)
//! may.

use std::path::{Path, PathBuf};

pub mod hosts;
mod manifest;
pub mod snapshot;

pub use hosts::{HostEntry, HostsError, HostsFile};
pub use manifest::{
    BlockedSyscallsManifest, CaptureManifest, ClockPoint, CpuManifest, Manifest, ManifestError,
    OtlpPorts, ProfileManifest, Snapshot, SocketCallsManifest, TcpKeysManifest, ThrottleManifest,
    FORMAT_VERSION,
};
pub use snapshot::{SnapshotError, SnapshotInfo, SnapshotStatus, SnapshotTrigger};

/// Paths relative to the run folder, as the manifest records them.
pub mod layout {
    pub const MANIFEST: &str = "manifest.json";
    pub const PROCESSES: &str = "processes.json";
    pub const HOSTS: &str = "hosts.json";
    pub const SNAPSHOT: &str = "snapshot.json";
    pub const KERNEL_DIR: &str = "kernel";
    pub const TRACE_DAT: &str = "kernel/trace.dat";
    pub const SAVED_TGIDS: &str = "kernel/saved_tgids";
    pub const CTF_DIR: &str = "kernel/ctf";
    pub const JOURNAL_DIR: &str = "kernel/journal";
    pub const KERNEL_SNAPSHOTS_DIR: &str = "kernel/snapshots";
    pub const TCP_SEGMENTS: &str = "kernel/tcp_segments.tsv";
    pub const CFS_THROTTLE: &str = "kernel/cfs_throttle.tsv";
    pub const BLOCKED_SYSCALLS: &str = "kernel/blocked_syscalls.tsv";
    pub const SOCKET_CALLS: &str = "kernel/socket_calls.tsv";
    pub const IDLE_SWITCHES: &str = "kernel/idle_switches.tsv";
    pub const SPANS_DIR: &str = "spans";
    pub const PROFILE_DIR: &str = "profile";
    pub const ANALYSIS_DIR: &str = "analysis";
    pub const DEMO_DIR: &str = "demo";
}

/// File names inside `RUN/analysis/`: `requests.json` and the Parquet
/// tables of `docs/tables.md`. The analysis is written into a staging
/// folder under these names, then renamed into place as a whole.
pub mod analysis {
    pub const REQUESTS_JSON: &str = "requests.json";
    pub const PLACEMENTS_JSON: &str = "placements.json";
    pub const THREAD_STATES: &str = "thread_states.parquet";
    pub const SYSCALLS: &str = "syscalls.parquet";
    pub const REQUESTS: &str = "requests.parquet";
    pub const CRITICAL_PATH: &str = "critical_path.parquet";
    /// The paths of the requests' time queued before their spans, in
    /// `critical_path`'s columns.
    pub const QUEUE_PATH: &str = "queue_path.parquet";
    pub const REQUEST_SUMMARY: &str = "request_summary.parquet";
    pub const REQUEST_SYSCALLS: &str = "request_syscalls.parquet";
    pub const OPERATION_SUMMARY: &str = "operation_summary.parquet";
    pub const DIAGNOSES: &str = "diagnoses.parquet";
    pub const CONTAINERS: &str = "containers.parquet";
    /// Every thread's states and every CPU's threads, per lane and time
    /// (`deepspan_store::history`).
    pub const STATE_HISTORY: &str = "state_history.bin";
}

/// File names inside `RUN/kernel/journal/`, the journal of a recording in
/// progress (what each holds: `deepspan_record`'s journal module).
pub mod journal {
    pub const RECORDING: &str = "recording.json";
    pub const TRACE_META: &str = "trace_meta.json";
    pub const CLOCK_SAMPLES: &str = "clock_samples";
    pub const SNAPSHOTS: &str = "snapshots";
    pub const TASKS: &str = "tasks";
}

/// Names inside `RUN/profile/`, the CPU samples of `record --profile`
/// (what each holds: `deepspan_profile`'s samples module).
pub mod profile {
    pub const SAMPLES: &str = "samples.zst";
    /// One file per sampled process, named by its pid.
    pub const MAPS_DIR: &str = "maps";
    pub const KALLSYMS: &str = "kallsyms.zst";

    /// A JIT runtime's perf map, kept under the name it has in /tmp.
    pub fn perf_map(pid: i32) -> String {
        format!("perf-{pid}.map")
    }
}

/// File names inside `RUN/demo/`: what a demo scenario expects, and the
/// log of its `deepspan analyze`.
pub mod demo {
    pub const EXPECTED: &str = "expected.json";
    pub const ANALYZE_LOG: &str = "analyze.txt";
}

/// A run folder, by its root. Cheap to make from a path; it checks nothing
/// until a file is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    root: PathBuf,
}

impl Run {
    pub fn new(root: impl Into<PathBuf>) -> Run {
        Run { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A path the manifest recorded (relative to the run folder).
    pub fn file(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    pub fn manifest(&self) -> PathBuf {
        self.file(layout::MANIFEST)
    }

    /// The /proc scan taken while recording.
    pub fn processes(&self) -> PathBuf {
        self.file(layout::PROCESSES)
    }

    /// A merged run's hosts and their clock transforms.
    pub fn hosts(&self) -> PathBuf {
        self.file(layout::HOSTS)
    }

    /// What made the agent take this snapshot.
    pub fn snapshot(&self) -> PathBuf {
        self.file(layout::SNAPSHOT)
    }

    pub fn kernel_dir(&self) -> PathBuf {
        self.file(layout::KERNEL_DIR)
    }

    pub fn trace_dat(&self) -> PathBuf {
        self.file(layout::TRACE_DAT)
    }

    /// One CPU's ring-buffer pages as captured, before they become
    /// trace.dat (kept when it could not be written).
    pub fn raw_pages(&self, cpu: usize) -> PathBuf {
        self.kernel_dir().join(format!("cpu{cpu}.raw"))
    }

    pub fn saved_tgids(&self) -> PathBuf {
        self.file(layout::SAVED_TGIDS)
    }

    pub fn ctf_dir(&self) -> PathBuf {
        self.file(layout::CTF_DIR)
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.file(layout::JOURNAL_DIR)
    }

    pub fn kernel_snapshots_dir(&self) -> PathBuf {
        self.file(layout::KERNEL_SNAPSHOTS_DIR)
    }

    /// The `number`th flight-recorder snapshot of a recording, relative to
    /// the run folder (as the manifest records it).
    pub fn kernel_snapshot(number: usize) -> String {
        format!("{}/{number:03}.dat", layout::KERNEL_SNAPSHOTS_DIR)
    }

    /// One CPU's pages of the `number`th snapshot, before they become its
    /// trace.dat.
    pub fn snapshot_raw_pages(&self, number: usize, cpu: usize) -> PathBuf {
        self.kernel_snapshots_dir()
            .join(format!("{number:03}.cpu{cpu}.raw"))
    }

    pub fn tcp_segments(&self) -> PathBuf {
        self.file(layout::TCP_SEGMENTS)
    }

    pub fn cfs_throttle(&self) -> PathBuf {
        self.file(layout::CFS_THROTTLE)
    }

    pub fn blocked_syscalls(&self) -> PathBuf {
        self.file(layout::BLOCKED_SYSCALLS)
    }

    pub fn socket_calls(&self) -> PathBuf {
        self.file(layout::SOCKET_CALLS)
    }

    pub fn idle_switches(&self) -> PathBuf {
        self.file(layout::IDLE_SWITCHES)
    }

    pub fn spans_dir(&self) -> PathBuf {
        self.file(layout::SPANS_DIR)
    }

    /// The `number`th span file, `spans/otlp-NNN.pb`: a span store's
    /// files, read in name order.
    pub fn span_file(&self, number: u32) -> PathBuf {
        self.spans_dir().join(format!("otlp-{number:03}.pb"))
    }

    /// Whether `name` is a span file's name (see [`Run::span_file`]).
    pub fn is_span_file(name: &str) -> bool {
        name.starts_with("otlp-") && name.ends_with(".pb")
    }

    pub fn profile_dir(&self) -> PathBuf {
        self.file(layout::PROFILE_DIR)
    }

    pub fn analysis_dir(&self) -> PathBuf {
        self.file(layout::ANALYSIS_DIR)
    }

    /// A file of the analysis, by its name in [`analysis`].
    pub fn analysis_file(&self, name: &str) -> PathBuf {
        self.analysis_dir().join(name)
    }

    pub fn requests_json(&self) -> PathBuf {
        self.analysis_file(analysis::REQUESTS_JSON)
    }

    pub fn placements_json(&self) -> PathBuf {
        self.analysis_file(analysis::PLACEMENTS_JSON)
    }

    /// Where the demo's driver writes a scenario's expectations.
    pub fn demo_dir(&self) -> PathBuf {
        self.file(layout::DEMO_DIR)
    }

    /// A file of the demo scenario recorded here, by its name in [`demo`].
    pub fn demo_file(&self, name: &str) -> PathBuf {
        self.demo_dir().join(name)
    }

    /// Whether the folder holds a recording of any kind: a manifest, or
    /// spans received without one.
    pub fn looks_recorded(&self) -> bool {
        self.manifest().is_file() || self.spans_dir().is_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_layout_under_the_root() {
        let run = Run::new("/runs/r1");
        assert_eq!(run.trace_dat(), Path::new("/runs/r1/kernel/trace.dat"));
        assert_eq!(
            run.requests_json(),
            Path::new("/runs/r1/analysis/requests.json")
        );
        assert_eq!(
            run.analysis_file(analysis::DIAGNOSES),
            Path::new("/runs/r1/analysis/diagnoses.parquet")
        );
        assert_eq!(
            run.demo_file(demo::EXPECTED),
            Path::new("/runs/r1/demo/expected.json")
        );
        assert_eq!(run.file(layout::SAVED_TGIDS), run.saved_tgids());
    }

    #[test]
    fn a_folder_with_spans_only_looks_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let run = Run::new(dir.path());
        assert!(!run.looks_recorded());
        std::fs::create_dir(run.spans_dir()).unwrap();
        assert!(run.looks_recorded());
    }
}
