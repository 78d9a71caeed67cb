//! Integration tests of deepspan-analysis, one binary: the state model,
//! execution graphs and critical paths, request paths, diagnoses and
//! placement, on hand-made event scripts (`common::script`), Trace Compass
//! oracles (`shared/testdata`) and recorded trace.dat files. None needs
//! root, tracefs or a service: all run in `make check`.

mod common;

mod containers;
mod diagnosis;
mod distributed_stubs;
mod ftrace_smoke;
mod graph_scenarios;
mod placement;
mod properties;
mod requests;
mod state_model;
mod stubs;
