//! `deepspan record`: argument parsing and progress display over
//! `deepspan_record`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deepspan_record::{Mode, Progress, RecordOptions};

use crate::progress;

#[derive(Args)]
#[command(after_help = "Examples:
  deepspan record -o run1 -- ./server --port 8080
  deepspan record -o run2 --duration 10
  deepspan record -o run3 --mode flight -- ./server   # kill -USR2 <deepspan pid> to snapshot
  deepspan record -o run4 --profile -- ./server   # CPU stacks too, for `deepspan profile`
  deepspan record --recover run1   # finish a run whose recorder was killed
  deepspan record --cleanup")]
pub struct RecordArgs {
    /// Run folder to create (must not exist, or be empty).
    #[arg(short = 'o', long = "output", required_unless_present_any = ["cleanup", "recover"])]
    output: Option<PathBuf>,
    /// `standard` streams every event to disk; `flight` keeps the kernel ring
    /// buffer in overwrite mode and writes it only on SIGUSR2 and at exit.
    #[arg(long, value_enum, default_value_t = ModeArg::Standard)]
    mode: ModeArg,
    /// Ring-buffer size per CPU, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=16384))]
    buffer_mb: u64,
    /// An event preset or a comma-separated list of events
    /// (`sched:sched_switch,irq:*,sched_wakeup`). Presets: `lean` (the
    /// default: every event the analysis reads but the system calls; what a
    /// blocked thread waits in and the socket calls that place spans come
    /// from eBPF captures instead, at a fraction of the cost on
    /// syscall-heavy services); `analysis` (`lean` and every system call
    /// with its return value, for a deep dive: the calls that never sleep
    /// in the system-call table, each call's return value);
    /// `minimal` (the scheduler only).
    #[arg(long, default_value = "lean")]
    events: String,
    /// Trace only these processes (and their children); repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<i32>,
    /// The host this run stands for (default: the machine's name): runs of
    /// one machine's network namespaces or containers, named apart, are
    /// hosts of their own to `deepspan sync` and `deepspan analyze RUN…`.
    #[arg(long, value_name = "NAME")]
    host: Option<String>,
    /// Also record each TCP segment's (seq, ack_seq, flags) as it leaves and
    /// enters a device (an eBPF program built into deepspan), so `deepspan
    /// sync` can align this host's clock with others' to the µs; with --pid,
    /// the segments of those processes' network namespaces only.
    #[arg(long)]
    tcp_keys: bool,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Port of the run's OTLP/gRPC receiver, given to the command's environment.
    #[arg(long, default_value_t = 4317)]
    otlp_grpc_port: u16,
    /// Port of the run's OTLP/HTTP receiver, given to the command's environment.
    #[arg(long, default_value_t = 4318)]
    otlp_http_port: u16,
    /// Record without the OTLP receiver (spans can be added later with `deepspan import`).
    #[arg(long)]
    no_otlp: bool,
    /// Also sample every CPU's call stacks (perf_event, at HZ, 99 by
    /// default) for per-request CPU profiles (`deepspan profile`).
    #[arg(long, value_name = "HZ", num_args = 0..=1, default_missing_value = "99",
          value_parser = clap::value_parser!(u64).range(1..=10000))]
    profile: Option<u64>,
    /// Remove tracefs instances left by deepspan processes that died, once no
    /// process they traced is alive, then exit.
    #[arg(long, conflicts_with_all = ["output", "command", "recover"])]
    cleanup: bool,
    /// With --cleanup: remove them even while a process they traced runs.
    #[arg(long, requires = "cleanup")]
    force: bool,
    /// Finish the run folder of a recorder that died (SIGKILL, OOM): write its
    /// kernel/trace.dat and manifest from what it left, then exit.
    #[arg(long, value_name = "RUN", conflicts_with_all = ["output", "command"])]
    recover: Option<PathBuf>,
    /// The command to run and trace.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Standard,
    Flight,
}

pub fn run(args: RecordArgs) -> Result<ExitCode> {
    if args.cleanup {
        return cleanup(args.force);
    }
    if let Some(run) = &args.recover {
        recover(run)?;
        return Ok(ExitCode::SUCCESS);
    }
    let duration = match args.duration {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => bail!("--duration must be a positive number of seconds, not {s}"),
    };
    let out = args
        .output
        .expect("clap requires --output without --cleanup");
    // Listening before the command starts; port 0 becomes the real port in its environment.
    let receiver = (!args.no_otlp)
        .then(|| {
            crate::receive::start_run_receiver(
                &out,
                Some(args.otlp_grpc_port),
                Some(args.otlp_http_port),
            )
        })
        .transpose()?;
    let bound = |addr: Option<std::net::SocketAddr>, asked: u16| addr.map_or(asked, |a| a.port());
    let options = RecordOptions {
        out: out.clone(),
        mode: match args.mode {
            ModeArg::Standard => Mode::Standard,
            ModeArg::Flight => Mode::Flight,
        },
        buffer_kb_per_cpu: args.buffer_mb * 1024,
        events: args.events.into(),
        pids: args.pids,
        duration,
        command: args.command,
        otlp_grpc_port: bound(
            receiver.as_ref().and_then(|r| r.grpc_addr()),
            args.otlp_grpc_port,
        ),
        otlp_http_port: bound(
            receiver.as_ref().and_then(|r| r.http_addr()),
            args.otlp_http_port,
        ),
        profile_hz: args.profile,
        host: args.host,
        tcp_keys: args.tcp_keys,
    };
    let bar = progress::spinner("starting");
    let summary = deepspan_record::record(&options, &mut |p: &Progress| {
        bar.set_message(describe(p));
        bar.tick();
    })
    .with_context(|| format!("recording into {} failed", out.display()))?;
    bar.finish_and_clear();
    if let Some(receiver) = receiver {
        crate::receive::finish_run_receiver(receiver, &out)?;
    }
    eprintln!(
        "deepspan: recorded {} of kernel events into {} ({} lost)",
        human_bytes(summary.events_bytes),
        out.display(),
        summary.lost_events
    );
    for w in &summary.warnings {
        eprintln!("  warning: {w}");
    }
    Ok(match summary.exit_code {
        // Pass the traced command's status through, as a wrapper should.
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::SUCCESS,
    })
}

fn cleanup(force: bool) -> Result<ExitCode> {
    use deepspan_record::StaleInstance;
    let done = deepspan_record::cleanup_stale_instances(force)?;
    if done.is_empty() {
        eprintln!("no stale deepspan tracefs instances");
    }
    let mut kept = false;
    for instance in done {
        match instance {
            StaleInstance::Removed {
                instance,
                recorder_pid,
                unfinished_run,
            } => {
                eprintln!("removed the tracefs instance {instance} of the dead recorder (pid {recorder_pid})");
                if let Some(run) = unfinished_run {
                    eprintln!(
                        "  its run {} was never finished: `deepspan record --recover {}`",
                        run.display(),
                        run.display()
                    );
                }
            }
            StaleInstance::Kept {
                instance,
                recorder_pid,
                held_by,
            } => {
                kept = true;
                let holders: Vec<String> = held_by
                    .iter()
                    .map(|(pid, comm)| format!("pid {pid} ({comm})"))
                    .collect();
                eprintln!(
                    "kept the tracefs instance {instance} of the dead recorder (pid {recorder_pid}): \
                     {} it traced still running; stop it and run --cleanup again, or add --force",
                    holders.join(", ")
                );
            }
        }
    }
    // Something left behind on purpose is not a failure, but scripts may want to know.
    Ok(if kept {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// Finishes an interrupted run and says what it could not restore.
pub fn recover(run: &Path) -> Result<()> {
    let recovery = deepspan_record::recover(run)
        .with_context(|| format!("cannot recover the run {}", run.display()))?;
    let kept: u64 = recovery.kept_bytes.iter().sum();
    let dropped: u64 = recovery.dropped_bytes.iter().sum();
    eprintln!(
        "deepspan: recovered {}: {} of kernel pages into kernel/trace.dat ({} cut short by the crash left out)",
        run.display(),
        human_bytes(kept),
        human_bytes(dropped)
    );
    for note in &recovery.notes {
        eprintln!("  note: {note}");
    }
    Ok(())
}

/// Recovers `run` first if its recorder died without finishing it, so that
/// commands reading runs take such a folder as it is (with a note).
pub fn recover_if_unfinished(run: &Path) -> Result<()> {
    if deepspan_record::needs_recovery(run) {
        eprintln!(
            "deepspan: {} is a recording that never finished; recovering it first",
            run.display()
        );
        recover(run)?;
    }
    Ok(())
}

fn describe(p: &Progress) -> String {
    format!(
        "{} recorded, {} lost",
        human_bytes(p.bytes_written),
        p.lost_events
    )
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
