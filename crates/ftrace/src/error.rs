//! Errors of the trace.dat reader.
//!
//! Every decode error says where in the file it happened and what was
//! expected there, so that a broken trace can be investigated with a hex
//! dump instead of a debugger.

use std::fmt;
use std::path::PathBuf;

/// A position in a trace.dat file.
///
/// Compressed (v7) data has no file offset of its own, so a position inside
/// it is given as the file offset of its compressed block plus the offset
/// inside the uncompressed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    File(u64),
    Compressed { block: u64, offset: u64 },
}

impl Location {
    /// The location `delta` bytes further on.
    pub(crate) fn add(self, delta: u64) -> Location {
        match self {
            Location::File(o) => Location::File(o.saturating_add(delta)),
            Location::Compressed { block, offset } => Location::Compressed {
                block,
                offset: offset.saturating_add(delta),
            },
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(o) => write!(f, "trace.dat offset {o:#x}"),
            Location::Compressed { block, offset } => write!(
                f,
                "trace.dat offset {block:#x} (compressed block), uncompressed offset {offset:#x}"
            ),
        }
    }
}

/// Everything that can go wrong while reading a trace.dat file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{at}: read failed: {source}")]
    Io {
        at: Location,
        source: std::io::Error,
    },

    /// The file does not follow the trace.dat format at `at`.
    #[error("{at}: {what}")]
    Malformed { at: Location, what: String },

    /// The ring-buffer data of one CPU is broken at `at`.
    #[error("{at}: CPU {cpu} {what}")]
    Cpu {
        at: Location,
        cpu: u32,
        what: String,
    },

    /// A valid file using something this reader does not handle.
    #[error("{at}: unsupported: {what}")]
    Unsupported { at: Location, what: String },

    /// An event format file (`events/<system>/<name>/format`) is malformed.
    #[error("event format{}: line {line}: {what}", event_label(event))]
    Format {
        event: String,
        line: usize,
        what: String,
    },

    /// A record's payload does not match its event format.
    #[error("record at ts {ts} on CPU {cpu}, event {event}: field {field}: {what}")]
    Field {
        ts: u64,
        cpu: u32,
        event: String,
        field: String,
        what: String,
    },

    /// A record's event id has no format in the trace.
    #[error("record at ts {ts} on CPU {cpu}: no format for event id {id}")]
    UnknownEvent { ts: u64, cpu: u32, id: u16 },

    #[error("no CPU {cpu} in this trace (it has {cpus} CPUs)")]
    NoSuchCpu { cpu: u32, cpus: u32 },

    #[error("no buffer instance named {name:?} in this trace")]
    NoSuchInstance { name: String },
}

fn event_label(event: &str) -> String {
    if event.is_empty() {
        String::new()
    } else {
        format!(" of {event}")
    }
}

impl Error {
    pub(crate) fn malformed(at: Location, what: impl Into<String>) -> Error {
        Error::Malformed {
            at,
            what: what.into(),
        }
    }
}
