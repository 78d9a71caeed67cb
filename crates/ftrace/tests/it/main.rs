//! Integration tests of deepspan-ftrace, one binary: the trace.dat corpus
//! (shared/testdata/kernel/ftrace) and small traces from the test builder
//! (`common::builder`) decoded against trace-cmd, `retime_trace_dat`,
//! malformed and truncated input, the fuzz regressions
//! (tests/fuzz-regressions).
//!
//! Needs trace-cmd (the oracle; installed by `make check`'s set-up).
//! `live_formats` reads the running kernel's event formats from tracefs:
//! marked `#[ignore = "system: …"]`, it runs only under `make test`
//! (`--include-ignored`).

mod common;

mod built;
mod live_formats;
mod malformed;
mod report;
mod retime;
mod testdata;
mod truncated;
