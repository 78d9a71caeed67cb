//! The one error type of the reader.
//!
//! Every error names the file it comes from and, where it is about content,
//! the byte offset in that file, so a broken trace can be inspected with a
//! hex dump straight away.

use std::path::{Path, PathBuf};

/// Why a trace could not be opened or decoded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn data(path: &Path, offset: u64, message: impl Into<String>) -> Error {
        Error::Data {
            path: path.to_path_buf(),
            offset,
            message: message.into(),
        }
    }

    pub(crate) fn metadata(path: &Path, offset: u64, message: impl Into<String>) -> Error {
        Error::Metadata {
            path: path.to_path_buf(),
            offset,
            message: message.into(),
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Io { path, .. } | Error::Metadata { path, .. } | Error::Data { path, .. } => {
                path
            }
            Error::NoTrace(path) => path,
        }
    }

    /// The byte offset in [`Error::path`] the error is about, when it is about content.
    pub fn offset(&self) -> Option<u64> {
        match self {
            Error::Metadata { offset, .. } | Error::Data { offset, .. } => Some(*offset),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
