//! `deepspan agent`: spans pass through on their way to Jaeger, Tempo or a
//! collector; a span much slower than its operation's norm gets a kernel
//! snapshot of its time window, analysed at once, and reaches the back-end
//! carrying the diagnosis and the snapshot's id.
//!
//! The parts, each usable alone:
//! - [`detect`]: per (service, operation), a sliding median and the
//!   anomaly rule (Carosi 2018, §5.2.3: window 500, threshold 3), and
//!   a quantile of the operation's ordinary spans that it must exceed too;
//! - [`forward`]: the byte-bounded queue to the back-end that drops the
//!   oldest, and its sender;
//! - [`spans`]: the request spans of an OTLP request, detaching and
//!   annotating spans, the recent requests kept for snapshots;
//! - [`snapshot`]: the worker that turns anomalous spans into diagnosed
//!   run folders through `deepspan_record::FlightRecorder` and
//!   `deepspan_pipeline::analyze_run`;
//! - [`metrics`]: the counters as Prometheus text on `/metrics`;
//! - [`Agent`] (`agent.rs`) wires them behind the OTLP receiver.

mod agent;
pub mod detect;
pub mod forward;
pub mod metrics;
pub mod snapshot;
pub mod spans;

pub use agent::{attr, Agent, AgentConfig, AgentStats};
pub use deepspan_record::FlightOptions;
pub use detect::DetectorConfig;
pub use forward::ForwardConfig;
pub use snapshot::SnapshotConfig;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Forward(#[from] forward::Error),
    #[error(transparent)]
    Receiver(#[from] deepspan_otlp::Error),
    #[error(transparent)]
    Flight(#[from] deepspan_record::Error),
    #[error("cannot create the snapshot folder {0}: {1}")]
    Snapshots(std::path::PathBuf, #[source] std::io::Error),
    #[error("{0}")]
    Config(String),
    #[error("cannot start the agent's threads: {0}")]
    Threads(#[source] std::io::Error),
}
