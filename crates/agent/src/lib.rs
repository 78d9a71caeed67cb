//! The parts of `deepspan agent` (issue 17) that are plain libraries: the
//! agent receives OTLP spans, judges each against its operation's recent
//! durations ([`detect`]), and forwards every request to Jaeger, Tempo or a
//! collector through a byte-bounded queue that drops the oldest
//! ([`forward`]); its counters are served as Prometheus text ([`metrics`]).

pub mod detect;
pub mod forward;
pub mod metrics;
