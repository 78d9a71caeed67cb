//! `deepspan decode`: kernel trace → JSON summary or JSON lines.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use anyhow::{anyhow, bail, Context, Result};
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
    /// Streams (CPUs) decoded at once for the `json` summary; default: the
    /// number of CPUs. Counting needs no time order, so each thread takes
    /// whole streams; `--threads 1` (and `--limit`) decode in time order.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Jsonl,
}

pub fn run(args: DecodeArgs) -> Result<()> {
    let stdout = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, stdout);
    if args.path.is_dir() {
        crate::record::recover_if_unfinished(&args.path)?;
    }
    match resolve_trace(&args.path)? {
        Input::TraceDat(path) => {
            let trace =
                TraceDat::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            match args.format {
                Format::Json => summary(&trace, args.limit, threads(&args), &mut out)?,
                Format::Jsonl => lines(&trace, args.limit, &mut out)?,
            }
            print_warnings(&trace_dat_warnings(&trace));
        }
        Input::Ctf(path) => {
            let trace =
                CtfTrace::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            match args.format {
                Format::Json => ctf_summary(&trace, args.limit, threads(&args), &mut out)?,
                Format::Jsonl => ctf_lines(&trace, args.limit, &mut out)?,
            }
            print_warnings(&ctf_warnings(&trace));
        }
    }
    out.flush()?;
    Ok(())
}

enum Input {
    TraceDat(PathBuf),
    Ctf(PathBuf),
}

/// What a trace.dat cut short lost (the rest of it was decoded).
fn trace_dat_warnings(trace: &TraceDat) -> Vec<String> {
    trace
        .truncation()
        .map(ToString::to_string)
        .into_iter()
        .collect()
}

/// The CTF stream files found cut short (their whole packets were
/// decoded); complete once the trace has been read through.
fn ctf_warnings(trace: &CtfTrace) -> Vec<String> {
    trace
        .truncations()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// On stderr, after the output, so that they are the last thing seen.
fn print_warnings(warnings: &[String]) {
    for w in warnings {
        eprintln!("deepspan: warning: {w}");
    }
}

/// Adds the warnings to a JSON summary (only when there are some, so that
/// a whole trace's summary stays as it was).
fn with_warnings(mut doc: Json, warnings: Vec<String>) -> Json {
    if let (false, Some(map)) = (warnings.is_empty(), doc.as_object_mut()) {
        map.insert("warnings".into(), json!(warnings));
    }
    doc
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
    let in_run = deepspan_run::Run::new(path).trace_dat();
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
            entries
                .flatten()
                .any(|e| e.path().is_dir() && contains_ctf_metadata(&e.path(), depth - 1))
        })
}

fn format_name(trace: &TraceDat) -> String {
    format!("trace.dat v{}", trace.version())
}

/// Threads for the summary: `--threads`, else one per CPU; one with
/// `--limit` (the first events in time order).
fn threads(args: &DecodeArgs) -> usize {
    if args.limit.is_some() {
        return 1;
    }
    match args.threads {
        Some(n) => n as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// Events counted by a key (event id, event class), and lost events.
struct Tally {
    events: u64,
    by_key: Vec<u64>,
    lost: u64,
}

impl Tally {
    fn new(keys: usize) -> Tally {
        Tally {
            events: 0,
            by_key: vec![0; keys],
            lost: 0,
        }
    }

    #[inline]
    fn count(&mut self, key: usize) {
        self.by_key[key] += 1;
        self.events += 1;
    }

    fn add(&mut self, other: &Tally) {
        self.events += other.events;
        self.lost += other.lost;
        for (a, b) in self.by_key.iter_mut().zip(&other.by_key) {
            *a += b;
        }
    }
}

/// What the counting threads share: how far they got, and whether one
/// failed (the first error ends the command, so the others stop early).
#[derive(Default)]
struct Shared {
    decoded: AtomicU64,
    failed: AtomicBool,
}

impl Shared {
    /// Called every [`Shared::TICK`] events: notes them for the progress
    /// display; true when the thread should stop.
    fn tick(&self) -> bool {
        self.decoded.fetch_add(Self::TICK, Ordering::Relaxed);
        self.failed.load(Ordering::Relaxed)
    }

    const TICK: u64 = 65_536;
}

/// Counts the events of `streams` (each with its size in bytes) on
/// `threads` threads, each taking whole streams: the largest streams first,
/// each to the thread with the least work so far. `count` decodes one
/// stream into a tally, calling [`Shared::tick`] as it goes.
fn count_in_parallel<S: Send>(
    streams: Vec<(u64, S)>,
    threads: usize,
    keys: usize,
    count: impl Fn(S, &mut Tally, &Shared) -> Result<()> + Sync,
) -> Result<Tally> {
    let mut streams = streams;
    streams.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
    let threads = threads.clamp(1, streams.len().max(1));
    let mut shares: Vec<(u64, Vec<S>)> = (0..threads).map(|_| (0, Vec::new())).collect();
    for (bytes, stream) in streams {
        if let Some(least) = shares.iter_mut().min_by_key(|(load, _)| *load) {
            least.0 += bytes;
            least.1.push(stream);
        }
    }
    let shared = Shared::default();
    let running = AtomicUsize::new(shares.len());
    let bar = progress::spinner("decoding");
    // Woken by each worker as it finishes, so that a short decode does not
    // wait out the progress period.
    let main = std::thread::current();
    let results: Vec<Result<Tally>> = std::thread::scope(|scope| {
        let workers: Vec<_> = shares
            .into_iter()
            .map(|(_, share)| {
                let (count, shared, running) = (&count, &shared, &running);
                let main = main.clone();
                scope.spawn(move || {
                    let mut tally = Tally::new(keys);
                    let done = share.into_iter().try_for_each(|s| {
                        if shared.failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        count(s, &mut tally, shared)
                    });
                    if done.is_err() {
                        shared.failed.store(true, Ordering::Relaxed);
                    }
                    running.fetch_sub(1, Ordering::Release);
                    main.unpark();
                    done.map(|()| tally)
                })
            })
            .collect();
        while running.load(Ordering::Acquire) > 0 {
            bar.set_message(format!("{} events", shared.decoded.load(Ordering::Relaxed)));
            std::thread::park_timeout(std::time::Duration::from_millis(50));
        }
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow!("a decoding thread panicked")))
            })
            .collect()
    });
    bar.finish_and_clear();
    let mut total = Tally::new(keys);
    let mut first_error = None;
    for result in results {
        match result {
            Ok(tally) => total.add(&tally),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

fn summary(
    trace: &TraceDat,
    limit: Option<u64>,
    threads: usize,
    out: &mut impl Write,
) -> Result<()> {
    let schema = trace.schema().clone();
    // Counting by numeric id keeps the hot loop free of string hashing.
    let ids = usize::from(u16::MAX) + 1;
    let tally = if threads > 1 && trace.cpus() > 1 {
        let cpus = (0..trace.cpus())
            .map(|cpu| Ok((trace.cpu_data_bytes_of(cpu), trace.cpu_records(cpu)?)))
            .collect::<Result<Vec<_>, deepspan_ftrace::Error>>()?;
        count_in_parallel(cpus, threads, ids, |mut records, tally, shared| {
            for record in records.by_ref() {
                let record = record?;
                // The typed decode is what every analysis pays for; do it
                // here too so that `decode` measures the real cost.
                std::hint::black_box(record.to_event(&schema));
                tally.count(usize::from(record.event_id));
                if tally.events % Shared::TICK == 0 && shared.tick() {
                    break;
                }
            }
            tally.lost += records.lost_events();
            Ok(())
        })?
    } else {
        let mut tally = Tally::new(ids);
        let bar = progress::bytes_bar(trace.cpu_data_bytes(), "decoding");
        let mut records = trace.records()?;
        while let Some(record) = records.next() {
            if limit.is_some_and(|l| tally.events >= l) {
                break;
            }
            let record = record?;
            std::hint::black_box(record.to_event(&schema));
            tally.count(usize::from(record.event_id));
            if tally.events.is_multiple_of(65_536) {
                bar.set_position(records.bytes_read());
            }
        }
        bar.finish_and_clear();
        tally.lost = records.lost_events();
        tally
    };
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    for (id, &count) in tally.by_key.iter().enumerate().filter(|(_, &c)| c > 0) {
        let name = match schema.event(id as u16) {
            Some(format) => format.name.clone(),
            None => format!("unknown_event_{id}"),
        };
        *by_name.entry(name).or_default() += count;
    }
    let doc = json!({
        "format": format_name(trace),
        "events": tally.events,
        "lost_events": tally.lost,
        "by_name": by_name,
    });
    let doc = with_warnings(doc, trace_dat_warnings(trace));
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn ctf_summary(
    trace: &CtfTrace,
    limit: Option<u64>,
    threads: usize,
    out: &mut impl Write,
) -> Result<()> {
    // Counting by the class's dense index keeps hashing out of the
    // per-event loop; classes are joined by name at the end (two traces
    // may declare the same name).
    let classes = trace.class_count();
    // Streams (cut into runs of packets when one holds more than a
    // thread's share) decoded on their own infer thread ids as the merged
    // order does (`stream_parts` is None when they would not).
    let streams = if threads > 1 {
        trace.stream_parts(threads)
    } else {
        None
    };
    let tally = match streams {
        Some(streams) if streams.len() > 1 => {
            let lost = streams.first().map(|s| s.lost_log());
            let streams = streams.into_iter().map(|s| (s.bytes(), s)).collect();
            let mut tally =
                count_in_parallel(streams, threads, classes, |events, tally, shared| {
                    for event in events {
                        let event = event?;
                        std::hint::black_box(event.to_event());
                        tally.count(event.class_index());
                        if tally.events % Shared::TICK == 0 && shared.tick() {
                            break;
                        }
                    }
                    Ok(())
                })?;
            tally.lost = lost.map_or(0, |l| l.total());
            tally
        }
        _ => {
            let mut tally = Tally::new(classes);
            let bar = progress::spinner("decoding CTF");
            let mut stream = trace.events();
            for event in stream.by_ref() {
                if limit.is_some_and(|l| tally.events >= l) {
                    break;
                }
                let event = event?;
                std::hint::black_box(event.to_event());
                tally.count(event.class_index());
                if tally.events.is_multiple_of(65_536) {
                    bar.set_message(format!("{} events", tally.events));
                }
            }
            bar.finish_and_clear();
            tally.lost = stream.lost_events();
            tally
        }
    };
    let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
    for (index, &count) in tally.by_key.iter().enumerate().filter(|(_, &c)| c > 0) {
        let name = trace.class_name(index).map_or("?", |n| n.as_str());
        *by_name.entry(name).or_default() += count;
    }
    let doc = json!({
        "format": "CTF 1.8",
        "events": tally.events,
        "lost_events": tally.lost,
        "by_name": by_name,
    });
    let doc = with_warnings(doc, ctf_warnings(trace));
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn ctf_lines(trace: &CtfTrace, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    for event in trace
        .events()
        .take(limit.map_or(usize::MAX, saturating_usize))
    {
        let event = event?;
        let fields = |fields: &deepspan_model::Fields| -> Map<String, Json> {
            fields
                .iter()
                .map(|(name, value)| (name.to_string(), value_json(value.clone())))
                .collect()
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
    }
    Ok(())
}

fn lines(trace: &TraceDat, limit: Option<u64>, out: &mut impl Write) -> Result<()> {
    let schema = trace.schema().clone();
    for record in trace
        .records()?
        .take(limit.map_or(usize::MAX, saturating_usize))
    {
        let record = record?;
        serde_json::to_writer(&mut *out, &event_json(&record, &schema)?)?;
        out.write_all(b"\n")?;
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

/// An event count limit as an iterator length (a limit beyond the address
/// space is no limit).
fn saturating_usize(limit: u64) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}
