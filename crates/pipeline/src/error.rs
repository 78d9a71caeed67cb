//! What can stop an analysis: each error says what failed, on which file or
//! folder, and why (its source).

use std::path::PathBuf;

/// Why [`crate::analyze_run`] could not analyse a run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path given is not a folder.
    #[error("{} is not a run folder", run.display())]
    NotARunFolder { run: PathBuf },
    /// The recorder died before finishing the run (its journal is still
    /// there): `deepspan_record::recover` must turn it into a trace first.
    #[error("{} is a recording that never finished: recover it first (`deepspan record --recover {}`)", run.display(), run.display())]
    UnfinishedRecording { run: PathBuf },
    /// Neither `kernel/trace.dat` nor `kernel/ctf/`.
    #[error("{} has no kernel trace (kernel/trace.dat or kernel/ctf/): record one with `deepspan record -o {} -- CMD`, or import an LTTng trace with `deepspan import -o {} --ctf DIR`", run.display(), run.display(), run.display())]
    NoKernelTrace { run: PathBuf },
    /// `kernel/trace.dat` could not be opened or its CPU data not found.
    #[error("cannot read the kernel trace {}", path.display())]
    OpenTraceDat {
        path: PathBuf,
        #[source]
        source: deepspan_ftrace::Error,
    },
    /// Decoding `kernel/trace.dat` failed part way.
    #[error("cannot decode {}", path.display())]
    DecodeTraceDat {
        path: PathBuf,
        #[source]
        source: deepspan_ftrace::Error,
    },
    /// `kernel/ctf/` could not be opened.
    #[error("cannot read the CTF kernel trace {}", path.display())]
    OpenCtf {
        path: PathBuf,
        #[source]
        source: deepspan_ctf::Error,
    },
    /// The CTF folder has only user-space traces.
    #[error("{}: the CTF folder holds no kernel trace (only {domains}), so there is nothing to build thread states from", path.display())]
    CtfWithoutKernel { path: PathBuf, domains: String },
    /// Decoding the CTF folder failed part way.
    #[error("cannot decode {}", path.display())]
    DecodeCtf {
        path: PathBuf,
        #[source]
        source: deepspan_ctf::Error,
    },
    /// The run's span files (`spans/`) could not be read.
    #[error("cannot read the spans of {}", run.display())]
    Spans {
        run: PathBuf,
        #[source]
        source: deepspan_spans::Error,
    },
    /// Writing a table or `requests.json` under `analysis/` failed (the
    /// store's error names the file).
    #[error(transparent)]
    Store(#[from] deepspan_store::Error),
    /// Writing another file of `analysis/` failed.
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A merged analysis of several hosts' runs cannot go on: a run, or the
    /// merged run's `hosts.json`, is not what it needs.
    #[error("{}: {reason}", path.display())]
    Hosts { path: PathBuf, reason: String },
    /// An input of [`crate::align::align_inputs`] is not a folder.
    #[error("cannot read the recorded TCP segments {}: {reason}", path.display())]
    TcpSegments { path: PathBuf, reason: String },
    #[error("cannot read the recorded throttled switch-outs {}: {reason}", path.display())]
    ThrottledSwitches { path: PathBuf, reason: String },
    #[error("cannot read the recorded sleeps in system calls {}: {reason}", path.display())]
    BlockedSyscalls { path: PathBuf, reason: String },
    #[error("cannot read the recorded socket calls {}: {reason}", path.display())]
    SocketCalls { path: PathBuf, reason: String },
    #[error("cannot read the recorded switches out of idle {}: {reason}", path.display())]
    IdleSwitches { path: PathBuf, reason: String },

    #[error("{}: not a run folder (manifest.json or spans/) nor a CTF trace folder", path.display())]
    NotAnAlignInput { path: PathBuf },
    /// A folder given to [`crate::align::align_inputs`] is not a run and
    /// cannot be read as a CTF trace either.
    #[error("{}: not a run folder (manifest.json or spans/), and not a CTF trace folder", path.display())]
    NotARunNorCtf {
        path: PathBuf,
        #[source]
        source: deepspan_ctf::Error,
    },
    /// Two inputs of [`crate::align::align_inputs`] name the same host: one
    /// host has one clock, so it takes one input.
    #[error("{} and {} are both host {host}: give one input per host (the clock of a host is one clock)", first.display(), second.display())]
    SameHostTwice {
        first: PathBuf,
        second: PathBuf,
        host: String,
    },
    /// The reference host asked for is none of the inputs' hosts.
    #[error("reference host {name}: no input is that host (hosts: {})", hosts.join(", "))]
    UnknownReference { name: String, hosts: Vec<String> },
    /// A run folder without a host name to align it by.
    #[error("{}: the run has no host name (no manifest.json with \"host\", no kernel/ctf/ trace with a hostname)", run.display())]
    NoHostName { run: PathBuf },
    /// A CTF folder whose traces carry no `hostname`.
    #[error("{}: no trace in it has a `hostname` in its CTF environment", path.display())]
    NoCtfHostname { path: PathBuf },
    /// A run's `manifest.json` could not be read for its host, boot or
    /// clock samples.
    #[error("{}: {reason}", path.display())]
    RunManifest { path: PathBuf, reason: String },
    /// A matched message could not be added to the clock graph (its times
    /// are too far apart to be one time base).
    #[error("{what} ({} → {})", from.display(), to.display())]
    Message {
        what: String,
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: deepspan_sync::SyncError,
    },
    /// The clock graph could not be solved (a bug: the reference is one of
    /// its hosts).
    #[error("cannot put the hosts on the reference clock")]
    Solve(#[source] deepspan_sync::SyncError),
    /// One of the analysis' own threads panicked (a bug).
    #[error("the {thread} thread panicked")]
    WorkerPanicked { thread: &'static str },
}
