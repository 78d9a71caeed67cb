//! The agent's integration tests, one binary: the anomaly detector against
//! a naive model (`detect`), the OTLP forwarder (`forward`) and the
//! `/metrics` endpoint (`metrics`) over loopback sockets the tests open
//! themselves. Three `forward` tests need a real Jaeger
//! (`#[ignore = "system: Jaeger"]`); none needs root or tracefs.

mod detect;
mod forward;
mod metrics;
