//! `deepspan profile RUN --request ID | --operation OP -o FILE.pb.gz`: the
//! request's (or every request of the operation's) wall time as pprof,
//! on-CPU stacks from `record --profile` and off-CPU frames from the
//! kernel critical path, over `deepspan_profile`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use deepspan_profile::{
    add_request, encode_gzip, read_samples, PathPiece, PprofBuilder, SampleIndex, Symbols, Totals,
};
use deepspan_store::report::{ReportPiece, ReportRequest};
use deepspan_store::{read_critical_paths, read_report};

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan record -o run --profile -- ./server
  deepspan analyze run
  deepspan profile run --request 5f2c9a0e1b7d4c33 -o slow.pb.gz
  deepspan profile run --operation 'GET /price' -o price.pb.gz
  go tool pprof -top slow.pb.gz")]
pub struct ProfileArgs {
    /// Run folder, recorded with `--profile` and analysed with `deepspan analyze`.
    run: PathBuf,
    /// Span id or trace id (hex) of one request.
    #[arg(
        long,
        value_name = "ID",
        required_unless_present = "operation",
        conflicts_with = "operation"
    )]
    request: Option<String>,
    /// Every request of this operation (`GET /price`, or `[service] GET /price`).
    #[arg(long, value_name = "OP")]
    operation: Option<String>,
    /// Where to write the gzip-compressed pprof profile.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
}

pub fn run(args: ProfileArgs) -> Result<()> {
    let manifest = deepspan_run::Manifest::load(&args.run)?;
    let Some(recorded) = manifest.profile else {
        bail!(
            "{} has no CPU samples: record it with `deepspan record --profile -o {} -- CMD`",
            args.run.display(),
            args.run.display()
        );
    };
    let profile_dir = args.run.join(&recorded.dir);
    let samples = read_samples(&profile_dir)?;
    if let Some(cut) = &samples.truncated {
        eprintln!("deepspan: note: {cut}");
    }
    let index = SampleIndex::new(samples.samples);
    let mut symbols = Symbols::open(&profile_dir);

    let requests: Vec<(ReportRequest, Vec<ReportPiece>)> = match (&args.request, &args.operation) {
        (Some(id), _) => {
            let report = read_report(&args.run, id)?;
            vec![(report.request, report.critical_path)]
        }
        (None, Some(op)) => read_critical_paths(&args.run, &requests_of(&args.run, op)?)?,
        (None, None) => unreachable!("clap requires --request or --operation"),
    };
    let start = requests.iter().map(|r| r.0.start_ns).min().unwrap_or(0);
    let end = requests.iter().map(|r| r.0.end_ns).max().unwrap_or(0);
    let mut out = PprofBuilder::new(
        manifest.start.realtime_ns as i64,
        end.saturating_sub(start) as i64,
    );
    out.comment(&format!(
        "deepspan profile of {} at {} Hz",
        args.run.display(),
        recorded.hz
    ));
    let mut totals = Totals::default();
    let mut duration = 0u64;
    for (request, critical_path) in &requests {
        let root = format!("[{}] {}", request.service, request.operation);
        let path: Vec<PathPiece> = critical_path.iter().map(piece).collect();
        duration += request.end_ns.saturating_sub(request.start_ns);
        totals.add(add_request(&mut out, &root, &path, &index, &mut symbols));
    }
    let bytes = encode_gzip(&out.finish());
    std::fs::write(&args.output, &bytes)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let human = deepspan_model::human::duration;
    println!(
        "{}: {} request(s), {}: on-CPU {} ({} samples; {} on threads that took no sample there), off-CPU {}",
        args.output.display(),
        requests.len(),
        human(duration),
        human(totals.on_cpu_ns),
        totals.samples,
        human(totals.unsampled_ns),
        human(totals.off_cpu_ns)
    );
    if recorded.lost > 0 {
        eprintln!(
            "deepspan: note: the kernel could not store {} CPU samples of this run",
            recorded.lost
        );
    }
    Ok(())
}

fn piece(p: &ReportPiece) -> PathPiece {
    PathPiece {
        start_ns: p.start_ns,
        end_ns: p.end_ns,
        state: p.state.clone(),
        tid: p.tid,
        comm: p.comm.clone(),
        syscall: p.syscall.clone(),
        blocked_by_request: p.blocked_by_request.clone(),
        throttled_ns: p.throttled_ns,
    }
}

/// The span ids of the requests of `op` (`GET /x` or `[svc] GET /x`) in
/// requests.json.
fn requests_of(run: &std::path::Path, op: &str) -> Result<Vec<String>> {
    let doc = deepspan_store::json::read_requests_json(run)?;
    let requests = doc.requests.len();
    let ids: Vec<String> = doc
        .requests
        .into_iter()
        .filter(|r| r.operation == op || format!("[{}] {}", r.service, r.operation) == op)
        .map(|r| r.span_id)
        .collect();
    if ids.is_empty() {
        bail!(
            "no request of operation {op:?} in {} ({requests} requests)",
            run.display(),
        );
    }
    Ok(ids)
}
