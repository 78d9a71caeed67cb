//! `deepspan decode`: kernel trace → JSON summary or JSON lines.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use deepspan_ctf::CtfTrace;
use deepspan_ftrace::{Record, Schema, TraceDat};
use deepspan_model::Value;
use serde_json::{json, Map, Value as Json};

use crate::progress;

#[derive(Args)]
pub struct DecodeArgs {
    /// A trace.dat file, a CTF trace folder (LTTng: one or more traces, e.g.
    /// kernel + ust), or a run folder written by `deepspan record`.
    path: PathBuf,
    /// `json`: one summary object; `jsonl`: one event per line, in time order.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
    /// Stop after this many events (both formats).
    #[arg(long)]
    limit: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Jsonl,
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let stdout = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    match resolve_trace(&args.path)? {
        Input::TraceDat(path) => {
            let trace =
                TraceDat::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            match args.format {
                Format::Json => summary(&trace, args.limit, &mut out)?,
                Format::Jsonl => lines(&trace, args.limit, &mut out)?,
            }
        }
        Input::Ctf(path) => {
            let trace =
                CtfTrace::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            match args.format {
                Format::Json => ctf_summary(&trace, args.limit, &mut out)?,
                Format::Jsonl => ctf_lines(&trace, args.limit, &mut out)?,
            }
        }
    }
    out.flush()?;
    Ok(())
}

enum Input {
    TraceDat(PathBuf),
    Ctf(PathBuf),
}

/// A run folder stands for its kernel trace; a folder holding a CTF
/// `metadata` file anywhere below it is a CTF trace; a file is a trace.dat.
fn resolve_trace(path: &Path) -> Result<Input> {
    if !path.exists() {
        bail!("{} does not exist", path.display());
    }
    if !path.is_dir() {
        return Ok(Input::TraceDat(path.to_path_buf()));
    }
    let in_run = path.join("kernel").join("trace.dat");
    if in_run.is_file() {
        return Ok(Input::TraceDat(in_run));
    }
    if contains_ctf_metadata(path, 4) {
        return Ok(Input::Ctf(path.to_path_buf()));
    }
    bail!(
        "{} is a folder with neither kernel/trace.dat nor a CTF metadata file: expected a trace.dat \
         file, a CTF trace folder or a run folder from `deepspan record`",
        path.display()
    )
}

fn contains_ctf_metadata(dir: &Path, depth: u32) -> bool {
    if dir.join("metadata").is_file() {
        return true;
    }
    depth > 0
        && std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| e.path().is_dir() && contains_ctf_metadata(&e.path(), depth - 1))
        })
}

fn format_name(trace: &TraceDat) -> String {
    format!("trace.dat v{}", trace.version())
}

fn summary(trace: &TraceDat, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    let schema = trace.schema().clone();
    // Counting by numeric id keeps the hot loop free of string hashing.
    let mut by_id = vec![0u64; usize::from(u16::MAX) + 1];
    let mut events = 0u64;
    let bar = progress::bytes_bar(trace.cpu_data_bytes(), "decoding");
    let mut records = trace.records()?;
    while let Some(record) = records.next() {
        if limit.is_some_and(|l| events >= l) {
            break;
        }
        let record = record?;
        // The typed decode is what every analysis pays for; do it here too so
        // that `decode` measures the real cost.
        std::hint::black_box(record.to_event(&schema));
        by_id[usize::from(record.event_id)] += 1;
        events += 1;
        if events % 65_536 == 0 {
            bar.set_position(records.bytes_read());
        }
    }
    bar.finish_and_clear();
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    for (id, &count) in by_id.iter().enumerate().filter(|(_, &c)| c > 0) {
        let name = match schema.event(id as u16) {
            Some(format) => format.name.clone(),
            None => format!("unknown_event_{id}"),
        };
        *by_name.entry(name).or_default() += count;
    }
    let doc = json!({
        "format": format_name(trace),
        "events": events,
        "lost_events": records.lost_events(),
        "by_name": by_name,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn ctf_summary(trace: &CtfTrace, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    // Counting by the class's dense index keeps hashing out of the
    // per-event loop; classes are joined by name at the end (two traces
    // may declare the same name).
    let mut by_class = vec![0u64; trace.class_count()];
    let mut events = 0u64;
    let bar = progress::spinner("decoding CTF");
    let mut stream = trace.events();
    while let Some(event) = stream.next() {
        if limit.is_some_and(|l| events >= l) {
            break;
        }
        let event = event?;
        std::hint::black_box(event.to_event());
        by_class[event.class_index()] += 1;
        events += 1;
        if events % 65_536 == 0 {
            bar.set_message(format!("{events} events"));
        }
    }
    bar.finish_and_clear();
    let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
    for (index, &count) in by_class.iter().enumerate().filter(|(_, &c)| c > 0) {
        let name = trace.class_name(index).map_or("?", |n| n.as_str());
        *by_name.entry(name).or_default() += count;
    }
    let doc = json!({
        "format": "CTF 1.8",
        "events": events,
        "lost_events": stream.lost_events(),
        "by_name": by_name,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn ctf_lines(trace: &CtfTrace, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    let mut written = 0u64;
    for event in trace.events() {
        if limit.is_some_and(|l| written >= l) {
            break;
        }
        let event = event?;
        let fields = |fields: &deepspan_model::Fields| -> Map<String, Json> {
            fields.iter().map(|(name, value)| (name.to_string(), value_json(value.clone()))).collect()
        };
        let doc = json!({
            "ts": event.ts(),
            "cpu": event.cpu(),
            "tid": event.tid(),
            "name": event.name(),
            "fields": fields(event.fields()),
            "context": fields(event.context()),
        });
        serde_json::to_writer(&mut *out, &doc)?;
        out.write_all(b"\n")?;
        written += 1;
    }
    Ok(())
}

fn lines(trace: &TraceDat, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    let schema = trace.schema().clone();
    let mut written = 0u64;
    for record in trace.records()? {
        if limit.is_some_and(|l| written >= l) {
            break;
        }
        let record = record?;
        serde_json::to_writer(&mut *out, &event_json(&record, &schema)?)?;
        out.write_all(b"\n")?;
        written += 1;
    }
    Ok(())
}

fn event_json(record: &Record, schema: &Schema) -> Result<Json> {
    let fields: Map<String, Json> = record
        .fields(schema)?
        .into_iter()
        .map(|(name, value)| (name.to_string(), value_json(value)))
        .collect();
    Ok(json!({
        "ts": record.ts,
        "cpu": record.cpu,
        "tid": record.tid(schema),
        "name": record.name(schema),
        "fields": fields,
    }))
}

pub fn value_json(value: Value) -> Json {
    match value {
        Value::Int(v) => json!(v),
        Value::UInt(v) => json!(v),
        Value::Float(v) => json!(v),
        Value::Str(s) => Json::String(s),
        Value::Bytes(b) => Json::Array(b.into_iter().map(|x| json!(x)).collect()),
        Value::Array(items) => Json::Array(items.into_iter().map(value_json).collect()),
    }
}
