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
    /// One of the analysis' own threads panicked (a bug).
    #[error("the {thread} thread panicked")]
    WorkerPanicked { thread: &'static str },
}
