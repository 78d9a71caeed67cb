//! `deepspan sync RUN_OR_TRACE…`: every host's clock as a linear transform
//! of a reference host's, with its bounds, printed. The messages are
//! gathered and matched by `deepspan_pipeline::align` (span pairs, TCP
//! segments of CTF folders and of runs recorded with `--tcp-keys` or
//! imported with `--ctf`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};
use deepspan_pipeline::align::{align_inputs_with_estimator, Alignment, TimeRange};
use deepspan_pipeline::Error;
use deepspan_sync::{Envelope, Estimator, HostSync};
use serde::Serialize;

#[derive(Args)]
pub struct SyncArgs {
    /// Run folders (spans, and TCP segments if recorded with --tcp-keys; the
    /// host is the manifest's `host`) and LTTng CTF folders (TCP packet
    /// events; the host is the trace's `hostname`), one per host.
    #[arg(required = true, value_name = "RUN_OR_TRACE")]
    inputs: Vec<PathBuf>,
    /// The host whose clock the others are mapped onto (default: the first
    /// input's host).
    #[arg(long, value_name = "HOST")]
    reference: Option<String>,
    /// The line taken between the two extreme lines that fit the messages:
    /// `most-room`, the one with the most room on both sides; `bisector`,
    /// Trace Compass's (the extreme lines averaged as the other host's time
    /// against the reference's), to compare with it.
    #[arg(long, value_enum, default_value_t = EstimatorArg::MostRoom)]
    estimator: EstimatorArg,
    /// `text`: a table; `json`: {"reference", "estimator", "hosts": [{host,
    /// input, slope, offset_ns, quality, matched, bounds, slope_min,
    /// slope_max, first_ns, last_ns, error_at_first_ns, error_at_last_ns,
    /// max_error_ns}]}.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum EstimatorArg {
    MostRoom,
    Bisector,
}

impl EstimatorArg {
    fn estimator(self) -> Estimator {
        match self {
            EstimatorArg::MostRoom => Estimator::MostRoom,
            EstimatorArg::Bisector => Estimator::Bisector,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

pub fn run(args: SyncArgs) -> Result<()> {
    let estimator = args.estimator.estimator();
    let alignment = align_inputs_with_estimator(&args.inputs, args.reference.as_deref(), estimator)
        .map_err(|e| match e {
            Error::UnknownReference { name, hosts } => anyhow!(
                "--reference {name}: no input is that host (hosts: {})",
                hosts.join(", ")
            ),
            e => e.into(),
        })?;
    let Alignment {
        reference,
        hosts,
        inputs,
        ranges,
        notes,
        // The table has them.
        bounds_notes: _,
    } = alignment;
    let rows: Vec<Row> = hosts
        .iter()
        .zip(&inputs)
        .zip(ranges)
        .map(|((host, input), range)| Row { host, input, range })
        .collect();
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => print_json(&mut out, &hosts[reference].host, estimator, &rows)?,
        Format::Text => print_text(&mut out, reference, estimator, &rows)?,
    }
    out.flush()?;
    for note in notes {
        eprintln!("deepspan sync: {note}");
    }
    Ok(())
}

/// One host as printed: its alignment, its input and the input's time
/// range.
struct Row<'a> {
    host: &'a HostSync,
    input: &'a PathBuf,
    range: Option<TimeRange>,
}

impl Row<'_> {
    /// The envelope and time range the bounds are judged over, when both
    /// exist.
    fn judged(&self) -> Option<(&Envelope, TimeRange)> {
        Some((self.host.bounds.envelope()?, self.range?))
    }
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    reference: &'a str,
    estimator: &'static str,
    hosts: Vec<JsonHost<'a>>,
}

#[derive(Serialize)]
struct JsonHost<'a> {
    host: &'a str,
    input: String,
    slope: f64,
    offset_ns: f64,
    quality: &'static str,
    matched: u64,
    /// `enclosed`, `unbounded` or `contradicted`: the slopes and errors
    /// below are null unless enclosed.
    bounds: &'static str,
    slope_min: Option<f64>,
    slope_max: Option<f64>,
    /// The input's time range, over which the errors are judged (null when
    /// it holds no time, and the errors with it).
    first_ns: Option<u64>,
    last_ns: Option<u64>,
    /// [lowest, highest] of (true − mapped) time at `first_ns`, and at
    /// `last_ns`.
    error_at_first_ns: Option<(f64, f64)>,
    error_at_last_ns: Option<(f64, f64)>,
    max_error_ns: Option<f64>,
}

fn print_json(
    out: &mut impl Write,
    reference: &str,
    estimator: Estimator,
    rows: &[Row],
) -> Result<()> {
    let doc = JsonOutput {
        reference,
        estimator: estimator.name(),
        hosts: rows
            .iter()
            .map(|row| {
                let h = row.host;
                let slopes = h.bounds.envelope().map(Envelope::slopes);
                let judged = row.judged();
                let error_at = |t: fn(&TimeRange) -> u64| {
                    judged.map(|(envelope, range)| envelope.deviation_at(&h.transform, t(&range)))
                };
                JsonHost {
                    host: &h.host,
                    input: row.input.display().to_string(),
                    slope: h.transform.slope,
                    offset_ns: h.transform.offset_ns,
                    quality: h.quality.name(),
                    matched: h.matched,
                    bounds: h.bounds.name(),
                    slope_min: slopes.map(|s| s.0),
                    slope_max: slopes.map(|s| s.1),
                    first_ns: row.range.map(|r| r.first_ns),
                    last_ns: row.range.map(|r| r.last_ns),
                    error_at_first_ns: error_at(|r| r.first_ns),
                    error_at_last_ns: error_at(|r| r.last_ns),
                    max_error_ns: max_error_ns(row),
                }
            })
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

/// The largest error of the host's mapped times over its input's range.
fn max_error_ns(row: &Row) -> Option<f64> {
    let (envelope, range) = row.judged()?;
    Some(envelope.max_error_ns(&row.host.transform, range.first_ns, range.last_ns))
}

fn print_text(
    out: &mut impl Write,
    reference: usize,
    estimator: Estimator,
    rows: &[Row],
) -> Result<()> {
    writeln!(
        out,
        "reference clock: {} ({})",
        rows[reference].host.host,
        rows[reference].input.display()
    )?;
    writeln!(
        out,
        "{:<20} {:<11} {:>8} {:>12} {:>22} {:>21} {:>15} {:<20} input",
        "host",
        "quality",
        "matched",
        "drift (ppm)",
        "offset (ns)",
        "drift bounds (ppm)",
        "max error (ns)",
        "through"
    )?;
    let ppm = |slope: f64| (slope - 1.0) * 1e6;
    for (i, row) in rows.iter().enumerate() {
        let h = row.host;
        let quality = if i == reference {
            "reference"
        } else {
            h.quality.name()
        };
        let drift_bounds = match h.bounds.envelope() {
            Some(envelope) => {
                let (low, high) = envelope.slopes();
                format!("{:.3}..{:.3}", ppm(low), ppm(high))
            }
            None => h.bounds.name().to_string(),
        };
        let max_error = match max_error_ns(row) {
            Some(error) => format!("{error:.0}"),
            // Enclosed, but the input holds no time to judge them over.
            None if h.bounds.envelope().is_some() => "-".to_string(),
            None => h.bounds.name().to_string(),
        };
        writeln!(
            out,
            "{:<20} {:<11} {:>8} {:>12.3} {:>22.1} {:>21} {:>15} {:<20} {}",
            h.host,
            quality,
            h.matched,
            ppm(h.transform.slope),
            h.transform.offset_ns,
            drift_bounds,
            max_error,
            h.parent.as_deref().unwrap_or("-"),
            row.input.display()
        )?;
    }
    writeln!(out, "a time t (ns) of a host is slope·t + offset on the reference clock, slope = 1 + drift·1e-6 ({} estimator)", estimator.name())?;
    writeln!(out, "drift bounds: of every clock that fits the messages; max error: the most a mapped time of the input's first..last time can be off, if the clocks are linear")?;
    Ok(())
}
