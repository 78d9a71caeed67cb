//! Kernel trace recording into a deepspan run folder.
//!
//! [`record`] traces the kernel in a private tracefs instance
//! (`instances/deepspan-<pid>-<unique>`, `trace_clock=mono`), optionally
//! while running a command, and leaves in the run folder:
//!
//! ```text
//! RUN/manifest.json            what was recorded, clock samples, lost events, exit code
//! RUN/kernel/trace.dat         the kernel trace (trace.dat v6, readable by trace-cmd)
//! RUN/kernel/snapshots/NNN.dat flight-mode snapshots (one per SIGUSR2)
//! RUN/kernel/saved_tgids       `tid tgid` lines: which threads belong to which process
//! RUN/kernel/cfs_throttle.tsv  threads switched out by their CPU cgroup's quota (eBPF; standard mode)
//! RUN/kernel/blocked_syscalls.tsv  sleeps inside system calls: the call, its first arguments and
//!                              the thread's bytes read so far (eBPF, x86_64; standard mode)
//! RUN/kernel/socket_calls.tsv  socket receives and sends that moved data: thread, time, bytes
//!                              (eBPF; standard mode)
//! RUN/kernel/idle_switches.tsv idle CPUs' switches to a thread, which ftrace loses (eBPF)
//! RUN/processes.json           pid, comm, command line, listening ports (/proc scanned at start,
//!                              each second for 10 s, at 16, 32, 64 … s, and at the end)
//! ```
//!
//! Top-level tracing settings are never changed, and the instance is removed
//! on every exit path (success, error, SIGINT/SIGTERM, panic).
//!
//! A recorder killed with SIGKILL (or by the OOM killer) leaves its run
//! unfinished, `RUN/kernel/cpuN.raw` and `RUN/kernel/journal/` without a
//! manifest, and its instance behind. [`recover`] finishes such a run from
//! its journal; [`cleanup_stale_instances`] removes the instance once no
//! process it traced is alive.

mod blocked_syscalls;
mod bpf;
mod capture;
mod capture_file;
mod error;
mod events;
mod flight;
mod host_access;
mod idle_switches;
mod journal;
mod meta;
mod procscan;
mod recover;
mod sched_switch;
mod session;
mod socket_calls;
mod sys;
mod tcpkeys;
mod throttle;
mod tracefs;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use deepspan_run::Manifest;

pub use blocked_syscalls::{parse_blocked_syscalls, read_blocked_syscalls, BlockedSyscall};
pub use error::Error;
pub use events::{resolve_events, EventId, PRESETS};
pub use flight::{FlightOptions, FlightRecorder, WindowOutcome};
pub use idle_switches::{parse_idle_switches, read_idle_switches, IdleSwitch};
pub use journal::{owners_dir, InstanceOwner, ProcessId};
pub use procscan::{ContainerEntry, ProcessEntry, ProcessScan};
pub use recover::{needs_recovery, recover, recover_from_files, Recovery};
pub use session::record;
pub use socket_calls::{parse_socket_calls, read_socket_calls, SocketCall};
pub use tcpkeys::{read_tcp_segments, TcpSegment};
pub use throttle::{read_throttled_switches, ThrottledSwitch};
pub use tracefs::Tracefs;

/// A (CLOCK_REALTIME, CLOCK_MONOTONIC) pair as the manifest's
/// `clock_samples` hold them: the realtime read bracketed by monotonic
/// reads, the tightest of three brackets kept, its midpoint as the
/// monotonic value.
pub fn clock_sample() -> [u64; 2] {
    let (realtime_ns, mono_ns) = sys::clock_pair();
    [realtime_ns, mono_ns]
}

/// This machine's name, as the manifest's `host` holds it (uname's
/// nodename).
pub fn host_name() -> String {
    let [_, nodename, ..] = sys::uname();
    nodename
}

/// How kernel events reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Everything is streamed to disk while recording.
    Standard,
    /// Flight recorder: the ring buffer overwrites its oldest events and
    /// nothing is written until SIGUSR2 (a snapshot of the buffer, to
    /// `kernel/snapshots/NNN.dat`) or the end (to `kernel/trace.dat`).
    /// A snapshot takes the events it writes out of the buffer: the next
    /// snapshot, and the final trace, hold only later events.
    Flight,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Standard => "standard",
            Mode::Flight => "flight",
        }
    }
}

/// Which kernel events to enable; by default the `lean` preset, as
/// `deepspan record` and the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventSelection {
    /// A preset or a comma list, resolved against the running kernel when
    /// recording starts (see [`resolve_events`]).
    Spec(String),
    /// Events already resolved (e.g. by [`resolve_events`]).
    Events(Vec<EventId>),
}

impl From<String> for EventSelection {
    fn from(spec: String) -> Self {
        EventSelection::Spec(spec)
    }
}

impl From<&str> for EventSelection {
    fn from(spec: &str) -> Self {
        EventSelection::Spec(spec.to_string())
    }
}

impl Default for EventSelection {
    fn default() -> Self {
        EventSelection::Spec("lean".to_string())
    }
}

/// What to record and where.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// The run folder; must not exist or be empty.
    pub out: PathBuf,
    pub mode: Mode,
    /// Ring-buffer size per CPU in KiB. In flight mode this is how much
    /// history a snapshot can hold.
    pub buffer_kb_per_cpu: u64,
    pub events: EventSelection,
    /// Trace only these processes (and the children they fork); empty = the
    /// whole system, which the critical-path analysis needs to follow
    /// wake-ups across processes.
    pub pids: Vec<i32>,
    /// Stop after this long. With a command, the command keeps running.
    pub duration: Option<Duration>,
    /// Command to run while recording (program and arguments); empty = none.
    pub command: Vec<OsString>,
    /// OTLP receiver ports, recorded in the manifest and passed to the
    /// command as OTEL_EXPORTER_OTLP_ENDPOINT.
    pub otlp_grpc_port: u16,
    pub otlp_http_port: u16,
    /// Sample every CPU's stacks at this rate (Hz) while recording, into
    /// `RUN/profile/`; None = no sampling.
    pub profile_hz: Option<u64>,
    /// The host the run stands for, in its manifest (None: the machine's
    /// name). Runs of one machine's network namespaces or containers are
    /// hosts of their own to `deepspan sync` and a merged analysis.
    pub host: Option<String>,
    /// Also record every TCP segment's (seq, ack_seq, flags) as it leaves
    /// and enters a device, into `RUN/kernel/tcp_segments.tsv` (an eBPF
    /// program compiled from C by build.rs with clang, loaded with aya),
    /// for `deepspan sync` across hosts. Standard mode only.
    pub tcp_keys: bool,
}

impl RecordOptions {
    /// Defaults: standard mode, 4 MiB per CPU, the `analysis` events, whole
    /// system, until the command exits or SIGINT/SIGTERM, OTLP on 4317/4318.
    pub fn new(out: impl Into<PathBuf>) -> RecordOptions {
        RecordOptions {
            out: out.into(),
            mode: Mode::Standard,
            buffer_kb_per_cpu: 4096,
            events: EventSelection::default(),
            pids: Vec::new(),
            duration: None,
            command: Vec::new(),
            otlp_grpc_port: 4317,
            otlp_http_port: 4318,
            profile_hz: None,
            host: None,
            tcp_keys: false,
        }
    }
}

/// Reported about once per second while recording.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub elapsed: Duration,
    /// Bytes of kernel trace written to disk so far (flight mode: by snapshots).
    pub bytes_written: u64,
    /// Standard mode: bytes written to disk per CPU. Flight mode: bytes held
    /// in each CPU's ring buffer.
    pub bytes_per_cpu: Vec<u64>,
    /// Events lost so far (see [`Manifest::lost_events`]).
    pub lost_events: u64,
    /// Flight-mode snapshots written so far.
    pub snapshots: usize,
    /// A command is running and recording waits for it.
    pub command_running: bool,
}

/// The outcome of a recording; the full record is in the manifest.
#[derive(Clone, Debug)]
pub struct RecordSummary {
    pub run_dir: PathBuf,
    /// `RUN/kernel/trace.dat`.
    pub kernel_trace: PathBuf,
    /// Exit status of the command (128+signal if killed by a signal);
    /// None without a command or if it was still running at the end.
    pub exit_code: Option<i32>,
    /// Bytes of ring-buffer pages in the kernel trace.
    pub events_bytes: u64,
    pub lost_events: u64,
    pub snapshots: usize,
    /// Non-fatal problems (also in the manifest).
    pub warnings: Vec<String>,
    pub manifest: Manifest,
}

/// What [`cleanup_stale_instances`] did with the instance of a recorder
/// that is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StaleInstance {
    /// Removed. `unfinished_run` is the dead recorder's run folder when it
    /// still needs [`recover`].
    Removed {
        instance: String,
        recorder_pid: i32,
        unfinished_run: Option<PathBuf>,
    },
    /// Kept: a process it traced is still running and its events are still
    /// being captured (`held_by` = pid and name).
    Kept {
        instance: String,
        recorder_pid: i32,
        held_by: Vec<(i32, String)>,
    },
}

/// Removes the tracing instances left by deepspan recorders that died
/// without cleaning up (SIGKILL, the OOM killer…): those named
/// `deepspan-<pid>-…` whose recorder no longer exists, once no process they
/// traced (the command, `--pid` processes; from the owner file the recorder
/// wrote) is alive. `force` removes them even then. Instances of live
/// recorders are never touched.
pub fn cleanup_stale_instances(force: bool) -> Result<Vec<StaleInstance>, Error> {
    let tracefs = Tracefs::open()?;
    let mut done = Vec::new();
    for name in tracefs.instances()? {
        let Some(pid) = tracefs::instance_owner(&name) else {
            continue;
        };
        let owner = journal::read_owner(&name);
        let recorder_alive = match &owner {
            Some(o) => o.recorder.alive(),
            None => sys::pid_alive(pid),
        };
        if recorder_alive {
            continue;
        }
        let held_by: Vec<(i32, String)> = owner
            .iter()
            .flat_map(|o| &o.traced)
            .filter(|p| p.alive())
            .map(|p| (p.pid, p.comm().unwrap_or_default()))
            .collect();
        if !held_by.is_empty() && !force {
            done.push(StaleInstance::Kept {
                instance: name,
                recorder_pid: pid,
                held_by,
            });
            continue;
        }
        tracefs::remove_instance_dir(&tracefs.path("instances").join(&name))?;
        journal::remove_owner(&name);
        let unfinished_run = owner.map(|o| o.run_dir).filter(|run| needs_recovery(run));
        done.push(StaleInstance::Removed {
            instance: name,
            recorder_pid: pid,
            unfinished_run,
        });
    }
    Ok(done)
}
