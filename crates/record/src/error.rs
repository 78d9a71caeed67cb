use std::io;
use std::path::{Path, PathBuf};

/// Why a recording could not start, go on, or be saved.
///
/// Every variant names the file or setting involved and what to do about it
/// where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "deepspan record needs root (or CAP_SYS_ADMIN/tracefs write access): cannot {action} {}: {source}",
        path.display()
    )]
    NeedRoot {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },

    #[error("tracefs is not available: {0}")]
    TracefsUnavailable(String),

    #[error("this host does not give the recorder what it needs:{}", .0.iter().map(|m| format!("\n  - {m}")).collect::<String>())]
    HostAccess(Vec<String>),

    #[error(
        "tracing instance {} already exists; another deepspan may be recording \
         (stale instances of dead recorders are removed by `cleanup_stale_instances`)",
        .0.display()
    )]
    InstanceExists(PathBuf),

    #[error("unknown kernel event '{name}'{}", suggestion_text(.suggestions))]
    UnknownEvent {
        name: String,
        suggestions: Vec<String>,
    },

    #[error("invalid event selection: {0}")]
    InvalidEvents(String),

    #[error("output folder {} exists and is not empty; choose a new or empty folder", .0.display())]
    OutputNotEmpty(PathBuf),

    #[error("invalid record options: {0}")]
    InvalidOptions(String),

    #[error(
        "disk full while writing {}: {source}; recording stopped and the tracing instance removed; \
         what was captured so far is kept in {}",
        path.display(), kept.display()
    )]
    DiskFull {
        path: PathBuf,
        kept: PathBuf,
        source: io::Error,
    },

    #[error("cannot start command {command:?}: {source}")]
    Spawn { command: String, source: io::Error },

    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },

    #[error(transparent)]
    TraceDat(#[from] deepspan_ftrace::WriteError),

    #[error("CPU profiling (--profile): {0}")]
    Profile(#[from] deepspan_profile::Error),

    #[error("cannot read the run manifest {}: {reason}", path.display())]
    Manifest { path: PathBuf, reason: String },

    #[error("cannot read the recording journal {}: {reason}", path.display())]
    Journal { path: PathBuf, reason: String },

    #[error("cannot recover {}: {reason}", run.display())]
    NotRecoverable { run: PathBuf, reason: String },

    #[error("cannot install the {signal} handler: {source}")]
    Signal {
        signal: &'static str,
        source: io::Error,
    },
}

fn suggestion_text(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        " (see /sys/kernel/tracing/available_events)".to_string()
    } else {
        format!("; did you mean {}?", suggestions.join(", "))
    }
}

impl Error {
    /// An I/O error on a tracefs file: permission problems become [`Error::NeedRoot`].
    pub(crate) fn tracefs(action: &'static str, path: &Path, source: io::Error) -> Error {
        match source.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => Error::NeedRoot {
                action,
                path: path.to_path_buf(),
                source,
            },
            _ => Error::Io {
                action,
                path: path.to_path_buf(),
                source,
            },
        }
    }

    /// An I/O error while writing captured data: ENOSPC/EDQUOT become [`Error::DiskFull`].
    pub(crate) fn output(
        action: &'static str,
        path: &Path,
        kept: &Path,
        source: io::Error,
    ) -> Error {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::DiskFull {
                path: path.to_path_buf(),
                kept: kept.to_path_buf(),
                source,
            },
            _ => Error::Io {
                action,
                path: path.to_path_buf(),
                source,
            },
        }
    }

    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> Error {
        Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// True for errors caused by a full disk (whatever step hit it).
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::DiskFull { .. } => true,
            Error::TraceDat(e) => {
                matches!(
                    e.io_error().and_then(io::Error::raw_os_error),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                )
            }
            _ => false,
        }
    }
}

impl From<deepspan_run::ManifestError> for Error {
    fn from(e: deepspan_run::ManifestError) -> Error {
        match e {
            deepspan_run::ManifestError::Read { path, reason } => Error::Manifest { path, reason },
            deepspan_run::ManifestError::Write { path, source } => {
                let run = path.parent().unwrap_or(&path).to_path_buf();
                Error::output("write", &path, &run, source)
            }
        }
    }
}
