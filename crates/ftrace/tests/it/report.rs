//! Field values against `trace-cmd report -R` (raw field output), record by
//! record, for every event of the corpus traces.

use std::process::Command;

use crate::common::*;
use deepspan_ftrace::TraceDat;
use deepspan_model::{EventKind, Value};

/// The text after `name=` up to the next ` <other>=` of the known names.
fn raw_value<'a>(fields: &'a str, name: &str, names: &[&str]) -> Option<&'a str> {
    let key = format!("{name}=");
    let start = if fields.starts_with(&key) {
        key.len()
    } else {
        fields.find(&format!(" {key}"))? + key.len() + 1
    };
    let rest = &fields[start..];
    let end = names
        .iter()
        .filter_map(|n| rest.find(&format!(" {n}=")))
        .min()
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

fn same_number(ours: &Value, theirs: &str, size: usize) -> bool {
    let theirs = theirs.trim();
    let parsed = if let Some(hex) = theirs.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()
    } else if let Ok(v) = theirs.parse::<i64>() {
        Some(v as u64)
    } else {
        theirs.parse::<u64>().ok()
    };
    let mask = if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
    };
    let ours = match ours {
        Value::Int(v) => *v as u64,
        Value::UInt(v) => *v,
        _ => return false,
    };
    parsed.is_some_and(|t| t & mask == ours & mask)
}

#[test]
fn fields_match_trace_cmd_report_raw() {
    if !have_trace_cmd() {
        return;
    }
    for trace in TRACES {
        let out = Command::new("trace-cmd")
            .args(["report", "-R", "-t"])
            .arg(dat(trace))
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<Line> = text.lines().filter_map(parse_line).collect();
        let t = TraceDat::open(&dat(trace)).unwrap();
        let schema = t.schema().clone();
        let records = all_records(&t);
        assert_eq!(
            lines.len(),
            records.len(),
            "{trace}: report lines vs records"
        );
        let mut compared = 0;
        for (i, (line, rec)) in lines.iter().zip(&records).enumerate() {
            assert_eq!(
                (line.ts, line.cpu, line.name.as_str()),
                (rec.ts, rec.cpu, rec.name(&schema)),
                "{trace}: record {i}"
            );
            let format = schema.event(rec.event_id).unwrap();
            let names: Vec<&str> = format.payload_fields().map(|f| f.name.as_str()).collect();
            for (name, value) in rec.fields(&schema).unwrap() {
                let f = format.field(&name).unwrap();
                let Some(theirs) = raw_value(&line.fields, &name, &names) else {
                    panic!("{trace}: record {i}: {name} missing in {:?}", line.fields)
                };
                let ok = match &value {
                    Value::Str(s) => {
                        s == theirs
                            || (s.is_empty() && theirs == "(null)")
                            || s.trim_end() == theirs.trim_end()
                    }
                    // trace-cmd shows instruction pointers as symbols (kallsyms).
                    Value::UInt(_)
                        if name.as_ref() == "ip"
                            && !theirs.starts_with(|c: char| c.is_ascii_digit()) =>
                    {
                        true
                    }
                    Value::Int(_) | Value::UInt(_) => same_number(&value, theirs, f.size),
                    // Arrays print in libtraceevent's own notation; not compared.
                    _ => true,
                };
                assert!(
                    ok,
                    "{trace}: record {i} ({}): {name}: ours {value:?}, trace-cmd {theirs:?}",
                    line.name
                );
                compared += 1;
            }
            // The typed path agrees with the generic one.
            if let EventKind::SchedSwitch(s) = rec.to_event(&schema).kind {
                assert_eq!(
                    Some(Value::Int(s.prev_tid.into())),
                    rec.field(&schema, "prev_pid")
                );
                assert_eq!(
                    Some(Value::Int(s.next_tid.into())),
                    rec.field(&schema, "next_pid")
                );
                assert_eq!(
                    Some(Value::Str(s.next_comm.to_string_lossy())),
                    rec.field(&schema, "next_comm")
                );
                assert_eq!(
                    Some(Value::Int(s.prev_state)),
                    rec.field(&schema, "prev_state")
                );
            }
        }
        assert!(
            compared > 10_000,
            "{trace}: only {compared} fields compared"
        );
    }
}
