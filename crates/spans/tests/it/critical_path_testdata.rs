//! Span-level critical path and self time against jaeger-ui's test cases
//! (../shared/testdata/spans/jaeger-ui-critical-path, spans/jaeger).

use crate::common::testdata;

use std::collections::HashMap;

use deepspan_spans::critical_path::{critical_path_report_with, operation_key, self_time_stats};
use deepspan_spans::{
    critical_path, group_traces, import_bytes, import_file, CriticalPathOptions, SpanId, Trace,
};
use serde_json::Value as J;

/// jaeger-ui's test traces use ids like "span-A"; Jaeger ids are hex, so the
/// ids are replaced by hex ones here (and mapped back for comparison).
fn hexify(trace: &mut J, names: &mut HashMap<u64, String>) {
    let mut map: HashMap<String, String> = HashMap::new();
    let fix = |v: &mut J, map: &mut HashMap<String, String>, names: &mut HashMap<u64, String>| {
        let s = v.as_str().unwrap().to_string();
        if SpanId::from_hex(&s).is_some() {
            names.insert(SpanId::from_hex(&s).unwrap().0, s);
            return;
        }
        let n = map.len() as u64 + 0x100;
        let h = map
            .entry(s.clone())
            .or_insert_with(|| format!("{n:x}"))
            .clone();
        names.insert(u64::from_str_radix(&h, 16).unwrap(), s);
        *v = J::String(h);
    };
    fix(&mut trace["traceID"], &mut map, names);
    for s in trace["spans"].as_array_mut().unwrap() {
        fix(&mut s["spanID"], &mut map, names);
        if let Some(refs) = s["references"].as_array_mut() {
            for r in refs {
                fix(&mut r["spanID"], &mut map, names);
                if r.get("traceID").is_some() {
                    fix(&mut r["traceID"], &mut map, names);
                }
            }
        }
        if s.get("traceID").is_some() {
            fix(&mut s["traceID"], &mut map, names);
        }
    }
}

/// (span name, section start µs, section end µs)
type Sections = Vec<(String, u64, u64)>;

fn load_case(i: usize) -> (Trace, HashMap<u64, String>, Sections) {
    let doc: J = serde_json::from_slice(
        &std::fs::read(testdata(&format!("jaeger-ui-critical-path/test{i}.json"))).unwrap(),
    )
    .unwrap();
    let mut trace = doc["trace"].clone();
    let mut names = HashMap::new();
    hexify(&mut trace, &mut names);
    let imp = import_bytes(
        serde_json::to_string(&trace).unwrap().as_bytes(),
        &format!("test{i}"),
    )
    .unwrap();
    let mut traces = group_traces(imp.spans);
    assert_eq!(traces.len(), 1);
    let expected = doc["expected_critical_path_sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["spanID"].as_str().unwrap().to_string(),
                s["sectionStart"].as_u64().unwrap(),
                s["sectionEnd"].as_u64().unwrap(),
            )
        })
        .collect();
    (traces.remove(0), names, expected)
}

fn sections_us(
    trace: &Trace,
    names: &HashMap<u64, String>,
    opts: CriticalPathOptions,
) -> Vec<(String, u64, u64)> {
    critical_path(trace, opts)
        .iter()
        .map(|s| {
            (
                names[&s.span_id.0].clone(),
                s.start_ns / 1000,
                s.end_ns / 1000,
            )
        })
        .collect()
}

#[test]
fn jaeger_ui_critical_path_cases_exactly() {
    for i in 1..=9 {
        let (trace, names, expected) = load_case(i);
        assert_eq!(
            sections_us(&trace, &names, CriticalPathOptions::jaeger_ui()),
            expected,
            "test{i}.json (Jaeger UI options)"
        );
        // The skew-tolerant defaults change nothing on these single-host traces.
        assert_eq!(
            sections_us(&trace, &names, CriticalPathOptions::default()),
            expected,
            "test{i}.json (default options)"
        );
    }
}

#[test]
fn report_shape_and_exclusive_time() {
    let (trace, _, _) = load_case(1);
    let report = critical_path_report_with(
        std::slice::from_ref(&trace),
        CriticalPathOptions::jaeger_ui(),
    );
    let v = serde_json::to_value(&report).unwrap();
    let t = &v["traces"][0];
    assert_eq!(t["trace_id"].as_str().unwrap().len(), 32);
    assert_eq!(t["sections"][0]["span_id"].as_str().unwrap().len(), 16);
    assert_eq!(t["sections"][0]["start_ns"], 60_000);
    assert_eq!(t["sections"][0]["end_ns"], 101_000);
    // span-C: 41+10+19 µs, span-E 10, span-D 20; the whole root duration is covered.
    assert_eq!(t["exclusive_ns"]["[customers-service] operation C"], 70_000);
    assert_eq!(t["exclusive_ns"]["[customers-service] operation E"], 10_000);
    assert_eq!(t["exclusive_ns"]["[customers-service] operation D"], 20_000);
    // Aggregate over two copies of the trace doubles.
    let mut other = trace.clone();
    other.trace_id.0 += 1;
    for s in &mut other.spans {
        s.trace_id = other.trace_id;
    }
    let report2 = critical_path_report_with(&[trace, other], CriticalPathOptions::jaeger_ui());
    assert_eq!(report2.traces.len(), 2);
    assert_eq!(
        report2.aggregate_exclusive_ns["[customers-service] operation C"],
        140_000
    );
    let keys: Vec<&String> = report2.aggregate_exclusive_ns.keys().collect();
    assert_eq!(keys.len(), 3);
}

#[test]
fn zipkin_skew_is_adjusted_before_the_walk() {
    let imp = import_file(&testdata("zipkin/skew.json")).unwrap();
    let traces = group_traces(imp.spans);
    let t = &traces[0];
    let name = |id: SpanId| {
        let s = t.spans.iter().find(|s| s.span_id == id).unwrap();
        operation_key(s)
    };
    let strict: Vec<(String, u64, u64)> = critical_path(t, CriticalPathOptions::jaeger_ui())
        .iter()
        .map(|s| (name(s.span_id), s.start_ns / 1000, s.end_ns / 1000))
        .collect();
    let tolerant: Vec<(String, u64, u64)> = critical_path(t, CriticalPathOptions::default())
        .iter()
        .map(|s| (name(s.span_id), s.start_ns / 1000, s.end_ns / 1000))
        .collect();
    // Without adjustment, serviceb's server span (65 ms early) is clipped to the
    // client and its async child, wholly before the client, is dropped.
    assert!(
        !strict.iter().any(|s| s.0 == "[serviceb] async"),
        "{strict:?}"
    );
    // With adjustment the server is centred in its client (+65 922 µs) and its
    // async child comes along, inside it.
    assert!(
        tolerant.iter().any(|s| s.0 == "[serviceb] async"),
        "{tolerant:?}"
    );
    let base = 1470150004000000u64;
    let rel: Vec<(String, u64, u64)> = tolerant
        .iter()
        .map(|(n, s, e)| (n.clone(), s - base, e - base))
        .collect();
    assert_eq!(
        rel,
        vec![
            ("[servicea] get".to_string(), 168741, 170479),
            ("[servicea] post".to_string(), 168260, 168741),
            ("[serviceb] post".to_string(), 139684, 168260),
            ("[serviceb] async".to_string(), 74684, 139684),
            ("[serviceb] post".to_string(), 74683, 74684),
            ("[servicea] post".to_string(), 74202, 74683),
            ("[servicea] get".to_string(), 71068, 74202),
        ]
    );
    // Sections tile the root: no overlap, no gap.
    let total: u64 = rel.iter().map(|r| r.2 - r.1).sum();
    assert_eq!(total, 170479 - 71068);
}

#[test]
fn crisp_overlap_allowance_takes_a_slightly_overlapping_sibling() {
    // Parent 0..1000 µs; A 0..500, B 498..1000: A overlaps B by 2 µs (0.2 % of the parent).
    let doc = br#"{"traceID":"1","spans":[
        {"traceID":"1","spanID":"a0","operationName":"P","references":[],"startTime":0,"duration":1000,"processID":"p"},
        {"traceID":"1","spanID":"a1","operationName":"A","references":[{"refType":"CHILD_OF","spanID":"a0"}],"startTime":0,"duration":500,"processID":"p"},
        {"traceID":"1","spanID":"a2","operationName":"B","references":[{"refType":"CHILD_OF","spanID":"a0"}],"startTime":498,"duration":502,"processID":"p"}],
        "processes":{"p":{"serviceName":"s"}}}"#;
    let t = group_traces(import_bytes(doc, "inline").unwrap().spans).remove(0);
    let us = |opts| {
        critical_path(&t, opts)
            .iter()
            .map(|s| (s.span_id.0, s.start_ns / 1000, s.end_ns / 1000))
            .collect::<Vec<_>>()
    };
    // Jaeger UI: A overlaps B, so after B the parent is on the path back to 0.
    assert_eq!(
        us(CriticalPathOptions::jaeger_ui()),
        vec![(0xa2, 498, 1000), (0xa0, 0, 498)]
    );
    // CRISP allowance: A happens before B; A is clipped at B's start.
    assert_eq!(
        us(CriticalPathOptions::default()),
        vec![(0xa2, 498, 1000), (0xa1, 0, 498)]
    );
}

fn ms2(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 100.0).round() / 100.0
}

#[test]
fn jaeger_ui_self_time_oracle() {
    let exp: J =
        serde_json::from_slice(&std::fs::read(testdata("jaeger/expected-self-time.json")).unwrap())
            .unwrap();
    let mut checked = 0;
    for case in exp["cases"].as_array().unwrap() {
        let group: Vec<&str> = case["group_by"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap())
            .collect();
        let Some(rows) = case["rows"].as_array() else {
            continue;
        };
        // Service and/or operation groupings only (tag groupings are a UI feature).
        if !group
            .iter()
            .all(|g| *g == "Service Name" || *g == "Operation Name")
            || case.get("procedure").is_some()
        {
            continue;
        }
        let fixture = case["fixture"].as_str().unwrap();
        let traces = group_traces(
            import_file(&testdata(&format!("jaeger/{fixture}")))
                .unwrap()
                .spans,
        );
        let t = &traces[0];
        let trace_ns = t.spans.iter().map(|s| s.end_ns).max().unwrap()
            - t.spans.iter().map(|s| s.start_ns).min().unwrap();
        let keyf = |g: &str, s: &deepspan_spans::Span| {
            if g == "Service Name" {
                s.service_name().to_string()
            } else {
                s.name.clone()
            }
        };
        // Rows as jaeger-ui lists them: first-level rows, each followed by its detail rows.
        let first = self_time_stats(&traces, |s| Some(keyf(group[0], s)));
        let mut table = Vec::new();
        for r in first {
            let k = r.key.clone();
            table.push(r);
            if group.len() == 2 {
                table.extend(self_time_stats(&traces, |s| {
                    (keyf(group[0], s) == k).then(|| keyf(group[1], s))
                }));
            }
        }
        for want in rows {
            let i = want["row"].as_u64().unwrap() as usize;
            let got = &table[i];
            let ctx = format!("{fixture} {group:?} row {i} ({})", got.key);
            if let Some(c) = want.get("count") {
                assert_eq!(got.count, c.as_u64().unwrap(), "{ctx}");
            }
            for (field, value) in [
                ("total", got.total_ns),
                ("min", got.min_ns),
                ("max", got.max_ns),
                ("selfTotal", got.self_total_ns),
                ("selfMin", got.self_min_ns),
                ("selfMax", got.self_max_ns),
            ] {
                if let Some(w) = want.get(field) {
                    assert_eq!(ms2(value), w.as_f64().unwrap(), "{ctx} {field}");
                }
            }
            if let Some(w) = want.get("selfAvg") {
                assert_eq!(
                    ms2(got.self_total_ns / got.count),
                    w.as_f64().unwrap(),
                    "{ctx} selfAvg"
                );
            }
            if let Some(w) = want.get("percent") {
                let p =
                    (got.self_total_ns as f64 / trace_ns as f64 * 100.0 * 100.0).round() / 100.0;
                assert_eq!(p, w.as_f64().unwrap(), "{ctx} percent");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 28, "rows checked");
}
