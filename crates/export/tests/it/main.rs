//! The exporter's integration tests, one binary: export of a fixed run,
//! the `--out` round trip, and sending to deepspan's own OTLP receiver and
//! to a flaky HTTP server, both on loopback and started by the tests.
//! Nothing here needs root, tracefs or an external service.

mod export;
