//! `deepspan ui RUN`: serves the web UI over a run's analysis, or over a
//! folder of the live agent's snapshots (a list, each one opening as a run).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct UiArgs {
    /// The run folder (analysed by `deepspan analyze`), or a folder of the
    /// agent's snapshots (one run folder with a snapshot.json each).
    pub run: PathBuf,
    /// TCP port; 0 lets the system pick one (printed).
    #[arg(long, default_value_t = 7878)]
    pub port: u16,
    /// Address to listen on. The default serves this machine only; anything
    /// else (e.g. 0.0.0.0) exposes the run's data to the network.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub bind: IpAddr,
}

pub fn run(args: UiArgs) -> Result<()> {
    if deepspan_ui_server::is_snapshot_folder(&args.run) {
        return serve_snapshots(args);
    }
    let started = Instant::now();
    let state = deepspan_ui_server::load(&args.run)
        .with_context(|| format!("cannot serve {}", args.run.display()))?;
    let threads = state
        .data
        .history
        .lanes()
        .iter()
        .filter(|l| matches!(l.key, deepspan_store::history::LaneKey::Thread(_)))
        .count();
    eprintln!(
        "loaded {} requests in {:.1} s; {} thread-state intervals of {} threads stay on disk",
        state.data.requests().len(),
        started.elapsed().as_secs_f64(),
        state.data.intervals,
        threads,
    );
    if !args.bind.is_loopback() {
        eprintln!(
            "warning: listening on {}: anyone who can reach this machine can read the run",
            args.bind
        );
    }
    deepspan_ui_server::run_blocking(state, SocketAddr::new(args.bind, args.port), |addr| {
        // stdout carries only the URL, so scripts and tests can read it.
        println!("http://{addr}/");
        eprintln!("serving {} (ctrl-C stops)", args.run.display());
    })
    .context("web server failed")
}

/// A folder of snapshots: the list at `/`, each snapshot under `/s/<id>/`,
/// loaded when first opened.
fn serve_snapshots(args: UiArgs) -> Result<()> {
    let index = deepspan_ui_server::SnapshotIndex::open(&args.run)
        .with_context(|| format!("cannot serve {}", args.run.display()))?;
    eprintln!(
        "{} snapshots in {} (each loaded when first opened)",
        index.list().len(),
        index.root().display()
    );
    if !args.bind.is_loopback() {
        eprintln!(
            "warning: listening on {}: anyone who can reach this machine can read the snapshots",
            args.bind
        );
    }
    let app = deepspan_ui_server::snapshots::router(index);
    deepspan_ui_server::run_blocking_router(app, SocketAddr::new(args.bind, args.port), |addr| {
        // stdout carries only the URL, so scripts and tests can read it.
        println!("http://{addr}/");
        eprintln!(
            "serving the snapshots in {} (ctrl-C stops)",
            args.run.display()
        );
    })
    .context("web server failed")
}
