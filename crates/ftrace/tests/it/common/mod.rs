//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use deepspan_ftrace::{Record, TraceDat};

pub mod builder;

pub const TRACES: [&str; 2] = ["sched_load", "example_rtapp"];

pub fn testdata(name: &str) -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/kernel/ftrace"
    ))
    .join(name)
}

pub fn dat(trace: &str) -> PathBuf {
    testdata(&format!("{trace}.dat"))
}

pub fn counts(trace: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(testdata(&format!("{trace}.counts.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// True when trace-cmd is installed. Without it a test fails, unless
/// DEEPSPAN_ALLOW_MISSING_TOOLS=1 says to skip.
pub fn have_trace_cmd() -> bool {
    let ok = Command::new("trace-cmd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() || !o.stdout.is_empty());
    if ok {
        return true;
    }
    if std::env::var("DEEPSPAN_ALLOW_MISSING_TOOLS").as_deref() == Ok("1") {
        eprintln!("trace-cmd is missing; skipping (DEEPSPAN_ALLOW_MISSING_TOOLS=1)");
        return false;
    }
    panic!("trace-cmd is not installed: install it (apt-get install trace-cmd) or set DEEPSPAN_ALLOW_MISSING_TOOLS=1 to skip");
}

/// Converts `input` to a v7 file with `compression`; `None` when this
/// trace-cmd build does not support that compression.
pub fn convert_v7(input: &Path, compression: &str, out: &Path) -> Option<PathBuf> {
    let o = Command::new("trace-cmd")
        .args([
            "convert",
            "--file-version",
            "7",
            "--compression",
            compression,
            "-i",
        ])
        .arg(input)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run trace-cmd convert");
    let stderr = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() || stderr.contains("not supported") || !out.exists() {
        eprintln!("trace-cmd convert --compression {compression} unavailable here: {stderr}");
        return None;
    }
    Some(out.to_path_buf())
}

/// All records of a trace (panics on error).
pub fn all_records(trace: &TraceDat) -> Vec<Record> {
    trace.records().unwrap().map(|r| r.unwrap()).collect()
}

/// Counts like the .counts.json oracles.
pub struct Summary {
    pub total: u64,
    pub per_name: BTreeMap<String, u64>,
    pub per_cpu: BTreeMap<String, u64>,
    pub first: u64,
    pub last: u64,
}

pub fn summarize(trace: &TraceDat) -> Summary {
    let schema = trace.schema().clone();
    let mut s = Summary {
        total: 0,
        per_name: BTreeMap::new(),
        per_cpu: BTreeMap::new(),
        first: u64::MAX,
        last: 0,
    };
    let mut prev = 0;
    for r in trace.records().unwrap() {
        let r = r.unwrap();
        assert!(
            r.ts >= prev,
            "records out of time order: {} after {}",
            r.ts,
            prev
        );
        prev = r.ts;
        s.total += 1;
        *s.per_name.entry(r.name(&schema).to_string()).or_default() += 1;
        *s.per_cpu.entry(r.cpu.to_string()).or_default() += 1;
        s.first = s.first.min(r.ts);
        s.last = s.last.max(r.ts);
    }
    s
}

pub fn check_against_counts(s: &Summary, trace: &str) {
    let c = counts(trace);
    assert_eq!(
        s.total,
        c["event_count"].as_u64().unwrap(),
        "{trace}: event count"
    );
    assert_eq!(
        s.first,
        c["first_event_ts_ns"].as_u64().unwrap(),
        "{trace}: first ts"
    );
    assert_eq!(
        s.last,
        c["last_event_ts_ns"].as_u64().unwrap(),
        "{trace}: last ts"
    );
    let map = |v: &serde_json::Value| -> BTreeMap<String, u64> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    };
    assert_eq!(
        s.per_name,
        map(&c["events_per_name"]),
        "{trace}: per-name counts"
    );
    assert_eq!(
        s.per_cpu,
        map(&c["events_per_cpu"]),
        "{trace}: per-CPU counts"
    );
}

/// One line of `trace-cmd report -R -t`.
pub struct Line {
    pub cpu: u32,
    pub ts: u64,
    pub name: String,
    pub fields: String,
}

pub fn parse_line(line: &str) -> Option<Line> {
    // "<comm>-<pid> [<cpu>] <secs>.<ns>: <event>: <k=v ...>"; the comm may
    // hold anything, so anchor on the "[cpu]" column.
    let open = line.match_indices('[').map(|(i, _)| i).find(|&i| {
        let rest = &line[i + 1..];
        let end = rest.find(']').unwrap_or(0);
        end > 0 && rest[..end].bytes().all(|b| b.is_ascii_digit())
    })?;
    let close = open + line[open..].find(']')?;
    let cpu = line[open + 1..close].parse().ok()?;
    let rest = line[close + 1..].trim_start();
    let (ts, rest) = rest.split_once(": ")?;
    // Seconds with nanoseconds, or (now and then, for the same file, when
    // several trace-cmd processes run at once: seen 3 times in 240 runs of
    // four at once) the bare nanosecond count trace-cmd prints for clocks
    // it does not take for nanoseconds.
    let ts = match ts.split_once('.') {
        Some((secs, ns)) => secs.parse::<u64>().ok()? * 1_000_000_000 + ns.parse::<u64>().ok()?,
        None => ts.parse::<u64>().ok()?,
    };
    let (name, fields) = rest.split_once(':')?;
    Some(Line {
        cpu,
        ts,
        name: name.trim().to_string(),
        fields: fields.trim().to_string(),
    })
}

/// `trace-cmd report <args> <file>` parsed into lines (records only).
pub fn report(args: &[&str], file: &Path) -> Vec<Line> {
    let out = Command::new("trace-cmd")
        .arg("report")
        .args(args)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "trace-cmd report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_line)
        .collect()
}
