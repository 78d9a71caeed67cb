//! Integration tests of deepspan-pipeline, one binary: `analyze_run` on a
//! real recording and on folders that are no run.
//!
//! `analyze_run::the_outcome_is_what_requests_json_says` records with the
//! kernel tracer (root and tracefs): it is `#[ignore = "system: …"]` and
//! runs only in `make test`.

mod analyze_run;
