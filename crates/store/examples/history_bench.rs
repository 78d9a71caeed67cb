//! The state history measured as Montplaisir et al. 2013 measure their state
//! history tree: build time, size on disk and query latency. Its twin,
//! `bench/history_bench.py`, asks PostgreSQL the same questions about the
//! same intervals; this program makes the inputs both sides share.
//!
//! Given a run folder that `deepspan analyze` has written, it
//! 1. reads `thread_states.parquet` into memory (timed apart: the pipeline
//!    has these states in memory already), then rebuilds the history from
//!    them into `OUT/state_history.bin` the way `tables::write_thread_states`
//!    does (the thread lanes as the table holds them, each CPU's lane from
//!    its threads' RUNNING intervals, cut so that none overlaps), and times
//!    that alone. The CPU lanes need nothing the table lacks, so the rebuild
//!    is checked against the run's own `state_history.bin`, lane by lane;
//!    a lane that differs is an error. What the table cannot hold is said:
//!    a thread the model knew with no state at all has an empty lane in the
//!    pipeline's file and none here;
//! 2. writes the intervals as PostgreSQL's COPY text format
//!    (`OUT/intervals.tsv`);
//! 3. picks queries from a fixed seed (threads weighted by their interval
//!    count, CPUs alike, times uniform over the run): the state of a thread
//!    at t; a thread's intervals in windows of 1 ms, 100 ms and 10 s; who
//!    ran on a CPU in 10 ms. Each is answered by the rebuilt file (the
//!    layout of the code measured, whichever binary analysed the run) from
//!    a History opened for that query alone ("fresh": the meta read and
//!    parsed each time) and from one opened once ("warm"), after the file
//!    was read once so that the page cache holds it in both. Each answer is its row count and the sum of
//!    its starts, so that PostgreSQL's can be compared with it
//!    (`OUT/queries.tsv`);
//! 4. writes its figures to `OUT/deepspan.json`.
//!
//! A window query visits its intervals ([`History::visit`]) and counts
//! them rather than collecting them: PostgreSQL's side aggregates on the
//! server too, so neither side measures handing rows to a client.
//!
//! ```text
//! cargo build --release -p deepspan-store --example history_bench
//! target/release/examples/history_bench RUN OUT [--queries N] [--long-queries N] [--seed S]
//! ```

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use deepspan_run::{analysis, Run};
use deepspan_store::history::{History, HistoryWriter, LaneKey, Record, NO_STRING};
use deepspan_store::rows::for_each_row;
use deepspan_store::tables::ThreadStateRow;
use rustc_hash::FxHashMap;
use serde_json::json;

type Failure = Box<dyn std::error::Error>;

const USAGE: &str = "usage: history_bench RUN OUT [--queries N] [--long-queries N] [--seed S]
  RUN   a run folder with analysis/thread_states.parquet and analysis/state_history.bin
  OUT   a folder for state_history.bin, intervals.tsv, queries.tsv and deepspan.json";

/// One row of `thread_states`, its strings as indices into [`Table::strings`]
/// (the table's own strings would cost a few allocations per row: a 4 GB
/// trace has tens of millions of rows).
struct Interval {
    start: i64,
    end: i64,
    state: u32,
    cpu: i32,
    waker: i32,
    syscall: u32,
    detail: u32,
}

struct Thread {
    tid: i32,
    pid: Option<i32>,
    comm: Option<String>,
    intervals: Vec<Interval>,
}

/// `thread_states` in memory, threads in the table's order (the model's,
/// which the pipeline wrote the history in).
#[derive(Default)]
struct Table {
    threads: Vec<Thread>,
    strings: Vec<String>,
    string_ids: FxHashMap<String, u32>,
}

impl Table {
    fn string(&mut self, s: String) -> u32 {
        if let Some(&id) = self.string_ids.get(&s) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.clone());
        self.string_ids.insert(s, id);
        id
    }

    fn optional_string(&mut self, s: Option<String>) -> u32 {
        s.map_or(NO_STRING, |s| self.string(s))
    }

    fn read(path: &Path) -> Result<Table, Failure> {
        let mut table = Table::default();
        let mut seen = FxHashMap::default();
        let mut broken = None;
        for_each_row(path, |row: ThreadStateRow| {
            let state = table.string(row.state);
            let syscall = table.optional_string(row.syscall);
            let detail = table.optional_string(row.detail);
            let interval = Interval {
                start: row.start_ns,
                end: row.end_ns,
                state,
                cpu: row.cpu.unwrap_or(-1),
                waker: row.waker_tid.unwrap_or(-1),
                syscall,
                detail,
            };
            let same_thread = table.threads.last().is_some_and(|t| t.tid == row.tid);
            if !same_thread {
                // The writer puts each thread's rows together; a thread seen
                // again would make its lane out of order.
                if seen.insert(row.tid, ()).is_some() && broken.is_none() {
                    broken = Some(row.tid);
                }
                table.threads.push(Thread {
                    tid: row.tid,
                    pid: row.pid,
                    comm: row.comm,
                    intervals: Vec::new(),
                });
            }
            table
                .threads
                .last_mut()
                .expect("pushed above")
                .intervals
                .push(interval);
        })?;
        if let Some(tid) = broken {
            return Err(format!(
                "{}: the rows of thread {tid} are not together; not a table the pipeline wrote",
                path.display()
            )
            .into());
        }
        Ok(table)
    }

    fn intervals(&self) -> usize {
        self.threads.iter().map(|t| t.intervals.len()).sum()
    }
}

/// The history half of `tables::write_thread_states`, from the table in
/// memory: the same strings in the same order, the same lanes, the CPU
/// lanes made the same way. Returns the file's size.
fn build_history(table: &Table, path: &Path) -> Result<u64, Failure> {
    let mut history = HistoryWriter::create(path)?;
    // The table's string index to the history's, made on first use as the
    // pipeline's `HistoryStrings` does, so the ids come out equal.
    let mut ids = vec![None::<u32>; table.strings.len()];
    let mut id = |history: &mut HistoryWriter, s: u32| -> u32 {
        if s == NO_STRING {
            return NO_STRING;
        }
        *ids[s as usize].get_or_insert_with(|| history.string(&table.strings[s as usize]))
    };
    let running = table.string_ids.get("RUNNING").copied();
    let mut cpus: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    for thread in &table.threads {
        let mut lane = Vec::with_capacity(thread.intervals.len());
        for i in &thread.intervals {
            let record = Record {
                start: i.start,
                end: i.end,
                state: id(&mut history, i.state),
                cpu: i.cpu,
                tid: i.waker,
                syscall: id(&mut history, i.syscall),
                detail: id(&mut history, i.detail),
            };
            if Some(i.state) == running && i.cpu >= 0 {
                cpus.entry(i.cpu).or_default().push(Record {
                    tid: thread.tid,
                    ..record
                });
            }
            lane.push(record);
        }
        history.lane(
            LaneKey::Thread(thread.tid),
            thread.pid,
            thread.comm.clone(),
            lane,
        )?;
    }
    for (cpu, slices) in cpus {
        history.cpu_lane(cpu, slices)?;
    }
    Ok(history.finish()?)
}

/// A record with its strings spelled out, to compare two files whose
/// string ids may differ.
type Spelled<'a> = (
    i64,
    i64,
    Option<&'a str>,
    i32,
    i32,
    Option<&'a str>,
    Option<&'a str>,
);

fn spelled<'a>(h: &'a History, r: &Record) -> Spelled<'a> {
    let s = |id: u32| h.string(id);
    (
        r.start,
        r.end,
        s(r.state),
        r.cpu,
        r.tid,
        s(r.syscall),
        s(r.detail),
    )
}

/// What differs between the pipeline's history and the rebuilt one. Lanes
/// with records that differ are errors; the notes are what the table
/// cannot carry.
fn compare(pipeline: &History, rebuilt: &History) -> Result<Vec<String>, Failure> {
    let mut notes = Vec::new();
    let mut errors = Vec::new();
    let rebuilt_keys: BTreeMap<LaneKey, usize> = rebuilt
        .lanes()
        .iter()
        .enumerate()
        .map(|(i, l)| (l.key, i))
        .collect();
    let mut empty_only_there = 0;
    for lane in pipeline.lanes() {
        let Some(&i) = rebuilt_keys.get(&lane.key) else {
            if lane.records == 0 {
                empty_only_there += 1;
            } else {
                errors.push(format!(
                    "lane {:?} ({} records) not rebuilt",
                    lane.key, lane.records
                ));
            }
            continue;
        };
        let other = &rebuilt.lanes()[i];
        if lane.pid != other.pid {
            errors.push(format!(
                "lane {:?}: pid {:?} against {:?}",
                lane.key, lane.pid, other.pid
            ));
        }
        if lane.comm != other.comm {
            // The table names a thread at each interval's start; the lane
            // keeps its first name, which may come before its first state.
            notes.push(format!(
                "lane {:?}: named {:?} in the pipeline's history, {:?} at its first row in the table",
                lane.key, lane.comm, other.comm
            ));
        }
        let mut ours = Vec::with_capacity(lane.records as usize);
        pipeline.visit(lane.key, i64::MIN, i64::MAX, |r| ours.push(*r))?;
        let mut position = 0usize;
        let mut first_difference = None;
        rebuilt.visit(lane.key, i64::MIN, i64::MAX, |r| {
            let same = ours
                .get(position)
                .is_some_and(|o| spelled(pipeline, o) == spelled(rebuilt, r));
            if first_difference.is_none() && !same {
                first_difference = Some(position);
            }
            position += 1;
        })?;
        if position != ours.len() {
            errors.push(format!(
                "lane {:?}: {} records rebuilt, {} in the pipeline's history",
                lane.key,
                position,
                ours.len()
            ));
        } else if let Some(at) = first_difference {
            errors.push(format!("lane {:?}: record {at} differs", lane.key));
        }
    }
    for lane in rebuilt.lanes() {
        if pipeline.lane(lane.key).is_none() {
            errors.push(format!(
                "lane {:?} rebuilt but not in the pipeline's history",
                lane.key
            ));
        }
    }
    if empty_only_there > 0 {
        notes.push(format!(
            "{empty_only_there} thread lanes without intervals are in the pipeline's history only (the table has no row for them)"
        ));
    }
    if !errors.is_empty() {
        return Err(format!(
            "the rebuilt history differs from the pipeline's:\n  {}",
            errors.join("\n  ")
        )
        .into());
    }
    Ok(notes)
}

/// COPY's text format: tab-separated, `\N` for null, backslash escapes.
fn write_copy_text(table: &Table, path: &Path) -> Result<u64, Failure> {
    let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let escaped: Vec<String> = table
        .strings
        .iter()
        .map(|s| {
            s.replace('\\', "\\\\")
                .replace('\t', "\\t")
                .replace('\n', "\\n")
                .replace('\r', "\\r")
        })
        .collect();
    let text = |id: u32| {
        if id == NO_STRING {
            "\\N"
        } else {
            escaped[id as usize].as_str()
        }
    };
    let mut rows = 0u64;
    for thread in &table.threads {
        for i in &thread.intervals {
            write!(
                out,
                "{}\t{}\t{}\t{}\t",
                thread.tid,
                i.start,
                i.end,
                text(i.state)
            )?;
            if i.cpu >= 0 {
                write!(out, "{}\t", i.cpu)?;
            } else {
                out.write_all(b"\\N\t")?;
            }
            if i.waker >= 0 {
                write!(out, "{}\t", i.waker)?;
            } else {
                out.write_all(b"\\N\t")?;
            }
            writeln!(out, "{}\t{}", text(i.syscall), text(i.detail))?;
            rows += 1;
        }
    }
    out.flush()?;
    Ok(rows)
}

/// An index into lanes whose cumulative interval counts are `cumulative`,
/// each lane as likely as its count.
fn weighted(random: &mut impl Rng, cumulative: &[u64]) -> usize {
    let total = *cumulative.last().expect("at least one lane");
    let x = random.random_range(0..total);
    cumulative.partition_point(|&c| c <= x)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    StateAt,
    ThreadWindow(i64),
    CpuWindow(i64),
}

const MS: i64 = 1_000_000;
const KINDS: [(&str, Kind); 5] = [
    ("state_at", Kind::StateAt),
    ("thread_1ms", Kind::ThreadWindow(MS)),
    ("thread_100ms", Kind::ThreadWindow(100 * MS)),
    ("thread_10s", Kind::ThreadWindow(10_000 * MS)),
    ("cpu_10ms", Kind::CpuWindow(10 * MS)),
];

struct Query {
    kind: &'static str,
    key: LaneKey,
    from: i64,
    /// For `state_at`, `from` itself.
    to: i64,
}

/// The answer both sides give: rows, and the sum of their starts (so that
/// the same count of other rows does not pass for the same answer).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
struct Answer {
    rows: u64,
    start_sum: i128,
}

fn answer(h: &History, q: &Query) -> Result<Answer, Failure> {
    let mut a = Answer::default();
    if q.kind == "state_at" {
        if let Some((_, r)) = h.state_at(q.key, q.from)? {
            a = Answer {
                rows: 1,
                start_sum: i128::from(r.start),
            };
        }
    } else {
        h.visit(q.key, q.from, q.to, |r| {
            a.rows += 1;
            a.start_sum += i128::from(r.start);
        })?;
    }
    Ok(a)
}

fn pick_queries(
    h: &History,
    per_kind: usize,
    long: usize,
    seed: u64,
) -> Result<Vec<Query>, Failure> {
    let (first, last) = h.range().ok_or("the state history holds no interval")?;
    let lanes_of = |thread: bool| -> (Vec<LaneKey>, Vec<u64>) {
        let mut keys = Vec::new();
        let mut cumulative = Vec::new();
        let mut total = 0;
        for lane in h.lanes() {
            if matches!(lane.key, LaneKey::Thread(_)) == thread && lane.records > 0 {
                total += lane.records;
                keys.push(lane.key);
                cumulative.push(total);
            }
        }
        (keys, cumulative)
    };
    let threads = lanes_of(true);
    let cpus = lanes_of(false);
    if threads.0.is_empty() || cpus.0.is_empty() {
        return Err("the state history has no thread lane or no CPU lane with intervals".into());
    }
    // A fixed seed gives the same queries on every machine.
    let mut random = ChaCha8Rng::seed_from_u64(seed);
    let mut queries = Vec::new();
    for (name, kind) in KINDS {
        let count = if kind == Kind::ThreadWindow(10_000 * MS) {
            long
        } else {
            per_kind
        };
        for _ in 0..count {
            let (lanes, width) = match kind {
                Kind::StateAt => (&threads, 0),
                Kind::ThreadWindow(w) => (&threads, w),
                Kind::CpuWindow(w) => (&cpus, w),
            };
            let key = lanes.0[weighted(&mut random, &lanes.1)];
            // A window longer than the run starts at its start.
            let from = random.random_range(first..=(last - width).max(first));
            queries.push(Query {
                kind: name,
                key,
                from,
                to: from + width,
            });
        }
    }
    Ok(queries)
}

/// p50, p99, mean and max of latencies in ns, as seconds.
fn summary(mut ns: Vec<u64>) -> serde_json::Value {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 - 1.0) * q).round() as usize] as f64 / 1e9;
    json!({
        "n": ns.len(),
        "p50_s": at(0.50),
        "p99_s": at(0.99),
        "max_s": at(1.0),
        "mean_s": ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e9,
    })
}

fn read_whole(path: &Path) -> Result<(), Failure> {
    let mut buffer = vec![0u8; 1 << 20];
    let mut f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    while f.read(&mut buffer)? > 0 {}
    Ok(())
}

struct Options {
    run: PathBuf,
    out: PathBuf,
    queries: usize,
    long_queries: usize,
    seed: u64,
}

fn options() -> Result<Options, Failure> {
    let mut args = std::env::args().skip(1);
    let mut positional = Vec::new();
    let (mut queries, mut long_queries, mut seed) = (500, 50, 20130u64);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> Result<u64, Failure> {
            let v = args
                .next()
                .ok_or(format!("{name} needs a value\n{USAGE}"))?;
            v.parse()
                .map_err(|_| format!("{name}: not a number: {v}\n{USAGE}").into())
        };
        match a.as_str() {
            "--queries" => queries = value("--queries")? as usize,
            "--long-queries" => long_queries = value("--long-queries")? as usize,
            "--seed" => seed = value("--seed")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown option {other}\n{USAGE}").into())
            }
            _ => positional.push(PathBuf::from(a)),
        }
    }
    let [run, out] = <[PathBuf; 2]>::try_from(positional).map_err(|_| USAGE.to_string())?;
    Ok(Options {
        run,
        out,
        queries,
        long_queries,
        seed,
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("history_bench: error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    let o = options()?;
    let run = Run::new(&o.run);
    let table_path = run.analysis_file(analysis::THREAD_STATES);
    let pipeline_path = run.analysis_file(analysis::STATE_HISTORY);
    for p in [&table_path, &pipeline_path] {
        if !p.is_file() {
            return Err(format!(
                "{} is missing: run `deepspan analyze {}` first",
                p.display(),
                o.run.display()
            )
            .into());
        }
    }
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let trace_bytes = std::fs::metadata(run.trace_dat()).map(|m| m.len()).ok();

    let clock = Instant::now();
    let table = Table::read(&table_path)?;
    let read_s = clock.elapsed().as_secs_f64();
    eprintln!(
        "history_bench: {} intervals of {} threads read from {} in {read_s:.2} s",
        table.intervals(),
        table.threads.len(),
        table_path.display()
    );

    let rebuilt_path = o.out.join(analysis::STATE_HISTORY);
    let clock = Instant::now();
    let history_bytes = build_history(&table, &rebuilt_path)?;
    let build_s = clock.elapsed().as_secs_f64();
    eprintln!("history_bench: history rebuilt in {build_s:.2} s, {history_bytes} bytes");

    let pipeline = History::open(&pipeline_path)?;
    let rebuilt = History::open(&rebuilt_path)?;
    let identical = std::fs::read(&pipeline_path)? == std::fs::read(&rebuilt_path)?;
    let notes = if identical {
        Vec::new()
    } else {
        compare(&pipeline, &rebuilt)?
    };
    for n in &notes {
        eprintln!("history_bench: note: {n}");
    }
    let cpu_slices: u64 = rebuilt
        .lanes()
        .iter()
        .filter(|l| matches!(l.key, LaneKey::Cpu(_)))
        .map(|l| l.records)
        .sum();
    let threads = rebuilt
        .lanes()
        .iter()
        .filter(|l| matches!(l.key, LaneKey::Thread(_)))
        .count();
    drop(pipeline);

    let clock = Instant::now();
    let tsv_path = o.out.join("intervals.tsv");
    let tsv_rows = write_copy_text(&table, &tsv_path)?;
    eprintln!(
        "history_bench: {tsv_rows} rows written to {} in {:.1} s",
        tsv_path.display(),
        clock.elapsed().as_secs_f64()
    );
    drop(table);

    // Queries are asked of the rebuilt file: it holds what the run's own
    // does (checked above), in the layout of the code measured, whichever
    // binary analysed the run.
    let queries = pick_queries(&rebuilt, o.queries, o.long_queries, o.seed)?;
    read_whole(&rebuilt_path)?;
    let mut fresh: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut warm: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut opens = Vec::new();
    let mut answers = Vec::with_capacity(queries.len());
    for q in &queries {
        let clock = Instant::now();
        let h = History::open(&rebuilt_path)?;
        let opened = clock.elapsed().as_nanos() as u64;
        let a = answer(&h, q)?;
        fresh
            .entry(q.kind)
            .or_default()
            .push(clock.elapsed().as_nanos() as u64);
        opens.push(opened);
        answers.push(a);
    }
    for (q, expected) in queries.iter().zip(&answers) {
        let clock = Instant::now();
        let a = answer(&rebuilt, q)?;
        warm.entry(q.kind)
            .or_default()
            .push(clock.elapsed().as_nanos() as u64);
        if a != *expected {
            return Err(format!(
                "{} of {:?} at {}: a fresh History answered {expected:?}, the warm one {a:?}",
                q.kind, q.key, q.from
            )
            .into());
        }
    }

    let queries_path = o.out.join("queries.tsv");
    let mut out = BufWriter::new(
        File::create(&queries_path).map_err(|e| format!("{}: {e}", queries_path.display()))?,
    );
    writeln!(out, "kind\tlane\tid\tfrom_ns\tto_ns\trows\tstart_sum_ns")?;
    for (q, a) in queries.iter().zip(&answers) {
        let (lane, id) = match q.key {
            LaneKey::Thread(t) => ("thread", t),
            LaneKey::Cpu(c) => ("cpu", c),
        };
        writeln!(
            out,
            "{}\t{lane}\t{id}\t{}\t{}\t{}\t{}",
            q.kind, q.from, q.to, a.rows, a.start_sum
        )?;
    }
    out.flush()?;

    let kinds: serde_json::Map<String, serde_json::Value> = KINDS
        .iter()
        .filter_map(|(name, _)| {
            let f = fresh.remove(name)?;
            let w = warm.remove(name)?;
            let rows: Vec<u64> = queries
                .iter()
                .zip(&answers)
                .filter(|(q, _)| q.kind == *name)
                .map(|(_, a)| a.rows)
                .collect();
            Some((
                name.to_string(),
                json!({
                    "fresh": summary(f),
                    "warm": summary(w),
                    "rows_mean": rows.iter().sum::<u64>() as f64 / rows.len() as f64,
                    "rows_max": rows.iter().max(),
                }),
            ))
        })
        .collect();
    let figures = json!({
        "run": o.run,
        "trace_bytes": trace_bytes,
        "intervals": tsv_rows,
        "threads": threads,
        "cpu_slices": cpu_slices,
        "table_bytes": std::fs::metadata(&table_path)?.len(),
        "read_table_s": read_s,
        "build_s": build_s,
        "history_bytes": history_bytes,
        "pipeline_history_bytes": std::fs::metadata(&pipeline_path)?.len(),
        "identical_to_pipeline": identical,
        "notes": notes,
        "open": summary(opens),
        "seed": o.seed,
        "queries": kinds,
    });
    let json_path = o.out.join("deepspan.json");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&figures)?)?;
    eprintln!(
        "history_bench: figures in {}, queries in {}",
        json_path.display(),
        queries_path.display()
    );
    Ok(())
}
