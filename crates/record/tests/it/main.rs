//! Integration tests of deepspan-record, one binary.
//!
//! `kernel`: recording against the running kernel through a private tracefs
//! instance; needs root and tracefs, so its tests are marked
//! `#[ignore = "system: …"]` and run only under `make test`
//! (`--include-ignored`). They run one at a time
//! ([`common::one_at_a_time`]).

mod common;

mod kernel;
