//! Integration tests of the `deepspan` command line, as one test binary:
//! the binary run as a user runs it on the shared test data, and end to end
//! on real recordings.
//!
//! Without `--include-ignored` (`make check`) only the tests that need no
//! root and no kernel tracing run. The others are marked
//! `#[ignore = "system: …"]`: root and tracefs (agent_jaeger, analyze_real,
//! crash_recovery, demo_real, deploy, export_jaeger, hosts_netns, java_agent,
//! java_app, placement_compare, placement_go, placement_real, profile_real,
//! queue_node, record_real_program, and one test each of spans_cli, ui_api and
//! ui_snapshots), some also cgroups, network namespaces, PostgreSQL and the
//! demo's packages, Jaeger, podman, a JDK with Maven, or Go. The heavy ones take
//! `common::one_at_a_time`.

mod common;

mod agent_jaeger;
mod analyze_ctf;
mod analyze_real;
mod crash_recovery;
mod crisp_cli;
mod decode_testdata;
mod demo_real;
mod deploy;
mod export_cli;
mod export_jaeger;
mod hosts_netns;
mod java_agent;
mod java_app;
mod opaque_ids;
mod placement_compare;
mod placement_go;
mod placement_node;
mod placement_real;
mod profile_real;
mod queue_node;
mod record_real_program;
mod spans_cli;
mod sync_bounds;
mod sync_cli;
mod ui_api;
mod ui_snapshots;
