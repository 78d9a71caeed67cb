//! `deepspan sync RUN_OR_TRACE…`: every host's clock as a linear transform
//! of a reference host's, printed. The messages are gathered and matched by
//! `deepspan_pipeline::align` (span pairs, TCP segments of CTF folders and
//! of runs recorded with `--tcp-keys` or imported with `--ctf`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};
use deepspan_pipeline::align::{align_inputs, Alignment};
use deepspan_pipeline::Error;
use deepspan_sync::HostSync;
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
    /// `text`: a table; `json`: {"reference", "hosts": [{host, input, slope,
    /// offset_ns, quality, matched}]}.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

pub fn run(args: SyncArgs) -> Result<()> {
    let alignment = align_inputs(&args.inputs, args.reference.as_deref()).map_err(|e| match e {
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
        notes,
    } = alignment;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => print_json(&mut out, &hosts[reference].host, &hosts, &inputs)?,
        Format::Text => print_text(&mut out, reference, &hosts, &inputs)?,
    }
    out.flush()?;
    for note in notes {
        eprintln!("deepspan sync: {note}");
    }
    Ok(())
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    reference: &'a str,
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
}

fn print_json(
    out: &mut impl Write,
    reference: &str,
    solved: &[HostSync],
    inputs: &[PathBuf],
) -> Result<()> {
    let doc = JsonOutput {
        reference,
        hosts: solved
            .iter()
            .zip(inputs)
            .map(|(h, input)| JsonHost {
                host: &h.host,
                input: input.display().to_string(),
                slope: h.transform.slope,
                offset_ns: h.transform.offset_ns,
                quality: h.quality.name(),
                matched: h.matched,
            })
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn print_text(
    out: &mut impl Write,
    reference: usize,
    solved: &[HostSync],
    inputs: &[PathBuf],
) -> Result<()> {
    writeln!(
        out,
        "reference clock: {} ({})",
        solved[reference].host,
        inputs[reference].display()
    )?;
    writeln!(
        out,
        "{:<20} {:<11} {:>8} {:>12} {:>22} {:<20} input",
        "host", "quality", "matched", "drift (ppm)", "offset (ns)", "through"
    )?;
    for (i, (h, input)) in solved.iter().zip(inputs).enumerate() {
        let quality = if i == reference {
            "reference"
        } else {
            h.quality.name()
        };
        writeln!(
            out,
            "{:<20} {:<11} {:>8} {:>12.3} {:>22.1} {:<20} {}",
            h.host,
            quality,
            h.matched,
            (h.transform.slope - 1.0) * 1e6,
            h.transform.offset_ns,
            h.parent.as_deref().unwrap_or("-"),
            input.display()
        )?;
    }
    writeln!(out, "a time t (ns) of a host is slope·t + offset on the reference clock, slope = 1 + drift·1e-6")?;
    Ok(())
}
