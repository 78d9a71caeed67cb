//! The one error type of the reader.
//!
//! Every error names the file it comes from and, where it is about content,
//! the byte offset in that file, so a broken trace can be inspected with a
//! hex dump straight away.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a trace could not be opened or decoded; [`Error::kind`] tells which
/// way.
///
/// Boxed: every event is handed out as a `Result<CtfEvent>`, and an error
/// held inline would make each of those four times as large to move.
pub struct Error(Box<ErrorKind>);

/// The ways reading a trace fails.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// The file system refused an operation.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TSDL metadata is malformed or describes something unsupported.
    /// `offset` is the byte offset in the metadata file (for packetized
    /// metadata, the file offset of the offending text byte).
    #[error("{}: byte {offset}: {message}", path.display())]
    Metadata {
        path: PathBuf,
        offset: u64,
        message: String,
    },
    /// A stream file does not match its metadata (truncated packet, sizes that
    /// lie, unknown event id, ...). `offset` is the byte offset in that file.
    #[error("{}: byte {offset}: {message}", path.display())]
    Data {
        path: PathBuf,
        offset: u64,
        message: String,
    },
    /// The directory holds no trace (no `metadata` file below it).
    #[error("{}: no CTF trace found (no `metadata` file in it or below it)", .0.display())]
    NoTrace(PathBuf),
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Error {
        ErrorKind::Io {
            path: path.to_path_buf(),
            source,
        }
        .into()
    }

    pub(crate) fn data(path: &Path, offset: u64, message: impl Into<String>) -> Error {
        ErrorKind::Data {
            path: path.to_path_buf(),
            offset,
            message: message.into(),
        }
        .into()
    }

    pub(crate) fn metadata(path: &Path, offset: u64, message: impl Into<String>) -> Error {
        ErrorKind::Metadata {
            path: path.to_path_buf(),
            offset,
            message: message.into(),
        }
        .into()
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self.kind() {
            ErrorKind::Io { path, .. }
            | ErrorKind::Metadata { path, .. }
            | ErrorKind::Data { path, .. } => path,
            ErrorKind::NoTrace(path) => path,
        }
    }

    /// The byte offset in [`Error::path`] the error is about, when it is about content.
    pub fn offset(&self) -> Option<u64> {
        match self.kind() {
            ErrorKind::Metadata { offset, .. } | ErrorKind::Data { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Error {
        Error(Box::new(kind))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
