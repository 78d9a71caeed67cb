//! Integration tests of deepspan-spans, one binary: importers, opaque ids,
//! run storage, clock mapping and span↔thread activity, the span-level
//! critical path and CRISP, on small hand-made traces and the public span
//! files of `shared/testdata/spans`. No root, tracefs or service: all run
//! in `make check`.

mod common;

mod crisp;
mod critical_path_testdata;
mod import_testdata;
mod opaque_ids;
mod store_clock_activity;
