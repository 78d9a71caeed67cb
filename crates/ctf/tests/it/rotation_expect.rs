//! lttng-tracefile-rotation (12 rotated files, 4 streams) against the
//! upstream babeltrace `.expect` dump (sink.text.details): for every event the
//! raw clock value, the absolute timestamp, the stream, the name and every
//! payload field value.

#![allow(clippy::manual_is_multiple_of)] // MSRV 1.80

use crate::common::corpus;
use deepspan_ctf::CtfTrace;
use deepspan_model::Value;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
struct Dump {
    ns: u64,
    cycles: u64,
    stream: u64,
    name: String,
    payload: Vec<(String, String)>,
}

fn number(s: &str) -> u64 {
    s.replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("number {s:?}"))
}

/// Parses the `Event` blocks of a sink.text.details dump.
fn parse_expect(text: &str) -> Vec<Dump> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let lines: Vec<&str> = block.lines().collect();
        if lines.len() < 3 || !lines[2].starts_with("Event `") {
            continue;
        }
        // [23,364,367,741,240 cycles, 1,571,261,795,523,067,504 ns from origin]
        let (cycles, rest) = lines[0]
            .trim_start_matches('[')
            .split_once(" cycles, ")
            .unwrap();
        let ns = rest.split_once(" ns").unwrap().0;
        // {Trace 0, Stream class ID 0, Stream ID 3}
        let stream = lines[1]
            .rsplit_once("Stream ID ")
            .unwrap()
            .1
            .trim_end_matches('}');
        let name = lines[2].split('`').nth(1).unwrap().to_string();
        let mut payload = Vec::new();
        for l in &lines[3..] {
            if let Some(kv) = l.strip_prefix("    ") {
                let (k, v) = kv
                    .split_once(": ")
                    .unwrap_or((kv.trim_end_matches(':'), ""));
                payload.push((k.to_string(), v.to_string()));
            }
        }
        out.push(Dump {
            ns: number(ns),
            cycles: number(cycles),
            stream: number(stream),
            name,
            payload,
        });
    }
    out
}

/// Integers the way sink.text.details prints them (thousands separators
/// from 5 digits on, as babeltrace does).
fn details(v: &Value) -> String {
    fn group(digits: &str) -> String {
        if digits.len() < 5 {
            return digits.to_string();
        }
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && ((digits.len() - i) % 3) == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    }
    match v {
        Value::Int(i) if *i < 0 => format!("-{}", group(&i.unsigned_abs().to_string())),
        Value::Int(i) => group(&i.to_string()),
        Value::UInt(u) => group(&u.to_string()),
        Value::Str(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// An array prints as `name: Length N:` then one `[i]: value` line each.
fn details_lines(name: &str, v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => {
            std::iter::once((name.to_string(), format!("Length {}:", items.len())))
                .chain(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, x)| (format!("  [{i}]"), details(x))),
                )
                .collect()
        }
        _ => vec![(name.to_string(), details(v))],
    }
}

#[test]
fn tracefile_rotation_matches_upstream_details_dump() {
    let dir = corpus("lttng-tracefile-rotation");
    let text = std::fs::read_to_string(dir.join("trace-lttng-tracefile-rotation.expect")).unwrap();
    let mut expect = parse_expect(&text);
    assert_eq!(expect.len(), 12305, "events in the .expect file");

    let trace = CtfTrace::open(dir.join("kernel")).unwrap();
    assert_eq!(trace.traces()[0].stream_count(), 4);
    let mut ours: Vec<Dump> = trace
        .events()
        .map(|e| {
            let e = e.unwrap();
            Dump {
                ns: e.ts(),
                cycles: e.clock_ticks(),
                stream: e.stream_instance().unwrap(),
                name: e.name().to_string(),
                payload: e
                    .fields()
                    .iter()
                    .flat_map(|(k, v)| details_lines(k, v))
                    .collect(),
            }
        })
        .collect();
    // The same order, except among events with equal timestamps.
    assert!(ours.windows(2).all(|w| w[0].ns <= w[1].ns));
    ours.sort();
    expect.sort();
    for (o, x) in ours.iter().zip(&expect) {
        assert_eq!(o, x);
    }
    assert_eq!(ours.len(), expect.len());
}
