//! `deepspan demo`: runs the scenarios of the demo application (`demo/`:
//! a small instrumented shop with PostgreSQL, and one injected fault per
//! scenario) under `deepspan record`, analyses each run with `deepspan
//! analyze` and checks that the requests the fault hit are diagnosed with
//! the expected cause and culprits.
//!
//! [`check`] compares a run's `analysis/requests.json` with the
//! `demo/expected.json` the scenario's driver wrote (pure, no I/O);
//! [`run`] does the orchestration (processes, signals, progress).

pub mod check;
pub mod run;

pub use check::{check, Expected, PathCheck, TopRequest, Verdict};
pub use run::{
    check_run, find_demo_dir, run_scenario, Interrupted, RunOptions, ScenarioRun, Signals,
    SCENARIOS,
};
