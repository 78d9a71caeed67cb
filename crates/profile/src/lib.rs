//! CPU profiles per span (`deepspan record --profile`, `deepspan profile`).
//!
//! Stages, each with a typed boundary:
//! - [`sampler`]: perf_event sampling on every CPU while a run records,
//!   into `RUN/profile/` ([`samples`] is that folder's format);
//! - [`symbols`]: addresses to names at analysis time, from what the run
//!   kept (kallsyms, mappings, JIT perf maps), through blazesym;
//! - [`attribute`]: a request's critical path with its samples, as on- and
//!   off-CPU stacks whose times add up to the request's duration;
//! - [`pprof`]: those stacks as gzip protobuf pprof;
//! - [`flame`]: the same stacks merged into a tree for the UI's flame graph.

pub mod attribute;
pub mod flame;
pub mod pprof;
pub mod sampler;
pub mod samples;
pub mod symbols;

use std::path::{Path, PathBuf};

pub use attribute::{add_request, PathPiece, SampleIndex, StackSink, StackValue, Totals};
pub use flame::{FlameNode, FlameTree};
pub use pprof::{encode_gzip, PprofBuilder};
pub use sampler::{Sampler, SamplerStats, DEFAULT_HZ};
pub use samples::{read_samples, Sample, Samples};
pub use symbols::{Frame, Symbols};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: at byte {offset} of the samples: {reason}")]
    Format {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("cannot sample CPU {cpu} with perf_event_open: {source} (perf_event_paranoid and the container must allow system-wide CPU-clock sampling; as root it does)")]
    PerfEvent { cpu: usize, source: std::io::Error },
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}
