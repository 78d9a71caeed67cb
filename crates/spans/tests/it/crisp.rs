//! CRISP's rules (crates/spans/src/crisp.rs) on small traces whose figures
//! follow from the rules by hand. (Checked by hand against CRISP's own
//! test_cases/1..25 too: same exclusive times, total work and time saved on
//! work; those files are not copied here.)

use std::collections::BTreeMap;
use std::sync::Arc;

use deepspan_spans::crisp::{crisp_report, crisp_trace, CrispOptions};
use deepspan_spans::model::{Attributes, Event, Resource, SpanKind, Value};
use deepspan_spans::{group_traces, Span, SpanId, TraceId};

fn span(
    id: u64,
    parent: Option<u64>,
    service: &str,
    op: &str,
    start: u64,
    end: u64,
    kind: SpanKind,
) -> Span {
    let mut s = Span::new(TraceId(7), SpanId(id), parent.map(SpanId), op, start, end);
    s.kind = kind;
    s.resource = Arc::new(Resource::with_service(service, Attributes::default()));
    s
}

fn exclusive(spans: Vec<Span>) -> (BTreeMap<String, u64>, Vec<String>, usize, usize) {
    let traces = group_traces(spans);
    let roots = crisp_trace(&traces[0], CrispOptions::default());
    assert_eq!(roots.len(), 1);
    let r = roots.into_iter().next().unwrap();
    (
        r.op_time_exclusive_ns,
        r.critical_path,
        r.shrunk_children,
        r.dropped_children,
    )
}

fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

use SpanKind::{Client, Internal, Server};

#[test]
fn a_small_overlap_between_children_is_happens_before() {
    // A overlaps B by 5 of the parent's 1000 (0.5 % < 1 %), nothing else in
    // the overlap: both on the path, the parent's exclusive time counts both.
    let (excl, path, _, _) = exclusive(vec![
        span(1, None, "S1", "P", 0, 1000, Server),
        span(2, Some(1), "S2", "A", 100, 505, Internal),
        span(3, Some(1), "S3", "B", 500, 900, Internal),
    ]);
    assert_eq!(
        excl,
        map(&[("[S1] P", 195), ("[S2] A", 405), ("[S3] B", 400)])
    );
    assert_eq!(
        path,
        vec![
            SpanId(1).to_string(),
            SpanId(3).to_string(),
            SpanId(2).to_string()
        ]
    );
}

#[test]
fn a_larger_overlap_is_not_and_a_third_child_in_the_overlap_breaks_it() {
    let (excl, _, _, _) = exclusive(vec![
        span(1, None, "S1", "P", 0, 1000, Server),
        span(2, Some(1), "S2", "A", 100, 600, Internal),
        span(3, Some(1), "S3", "B", 500, 900, Internal),
    ]);
    assert_eq!(excl, map(&[("[S1] P", 600), ("[S3] B", 400)]));
    let (excl, _, _, _) = exclusive(vec![
        span(1, None, "S1", "P", 0, 1000, Server),
        span(2, Some(1), "S2", "A", 100, 505, Internal),
        span(3, Some(1), "S3", "B", 500, 900, Internal),
        span(4, Some(1), "S4", "C", 300, 502, Internal),
    ]);
    // C's end lies in A/B's overlap (three events there): A does not happen
    // before B. C itself overlaps B by 2 with only B's start and its own end
    // in between: it does, and takes A's place on the path.
    assert_eq!(
        excl,
        map(&[("[S1] P", 398), ("[S3] B", 400), ("[S4] C", 202)])
    );
}

#[test]
fn overflowing_children_are_cut_and_children_outside_are_dropped() {
    let (excl, _, shrunk, dropped) = exclusive(vec![
        span(1, None, "S1", "P", 0, 100, Internal),
        span(2, Some(1), "S2", "C", 50, 150, Internal),
        span(3, Some(1), "S3", "D", 200, 300, Internal),
    ]);
    assert_eq!(excl, map(&[("[S1] P", 50), ("[S2] C", 50)]));
    assert_eq!((shrunk, dropped), (1, 1));
}

#[test]
fn a_server_under_its_client_keeps_its_place_with_its_duration_capped() {
    // 101 <= 1.01 x 100: kept where it is (skew), duration capped at 100, so
    // the client's exclusive time is 0 rather than negative.
    let (excl, path, shrunk, dropped) = exclusive(vec![
        span(1, None, "S1", "call", 0, 100, Client),
        span(2, Some(1), "S2", "serve", 10, 111, Server),
    ]);
    assert_eq!(excl, map(&[("[S1] call", 0), ("[S2] serve", 100)]));
    assert_eq!((path.len(), shrunk, dropped), (2, 0, 0));
    // 102 > 1.01 x 100: an ordinary child, cut at the client's end.
    let (excl, _, shrunk, _) = exclusive(vec![
        span(1, None, "S1", "call", 0, 100, Client),
        span(2, Some(1), "S2", "serve", 10, 112, Server),
    ]);
    assert_eq!(excl, map(&[("[S1] call", 10), ("[S2] serve", 90)]));
    assert_eq!(shrunk, 1);
}

#[test]
fn total_work_and_the_work_erring_spans_would_save() {
    let mut failing = span(2, Some(1), "S2", "A", 10, 40, Internal);
    failing
        .attributes
        .insert("http.status_code", Value::Int(503));
    let mut logged = span(3, Some(1), "S3", "B", 50, 70, Internal);
    logged.events.push(Event {
        name: "error".into(),
        time_ns: 60,
        attributes: Attributes::default(),
    });
    let fine = span(4, Some(1), "S4", "C", 75, 90, Internal);
    let mut not_an_error = span(5, Some(1), "S5", "D", 80, 85, Internal);
    not_an_error.attributes.insert("error", Value::Bool(false));
    let traces = group_traces(vec![
        span(1, None, "S1", "P", 0, 100, Server),
        failing,
        logged,
        fine,
        not_an_error,
    ]);
    let report = crisp_report(&traces, CrispOptions::default());
    assert_eq!(report.total_work_ns, 100 + 30 + 20 + 15 + 5);
    assert_eq!(report.time_saved_on_work_ns, 30 + 20);
}

#[test]
fn time_saved_on_the_critical_path_keeps_series_and_stops_at_a_parallel_branch() {
    // A (erring) then B in series: returning at once saves A's 40.
    let mut erring = span(2, Some(1), "S2", "A", 0, 40, Internal);
    erring.attributes.insert("error", Value::Bool(true));
    let parent = span(1, None, "S1", "P", 0, 100, Server);
    let after = span(3, Some(1), "S3", "B", 40, 100, Internal);
    let traces = group_traces(vec![parent.clone(), erring.clone(), after.clone()]);
    let report = crisp_report(&traces, CrispOptions::default());
    assert_eq!(
        (report.time_saved_on_cp_ns, report.time_saved_on_work_ns),
        (40, 40)
    );
    // C runs beside them until 80: B can only move back to end at 80.
    let beside = span(4, Some(1), "S4", "C", 0, 80, Internal);
    let traces = group_traces(vec![parent, erring, after, beside]);
    let report = crisp_report(&traces, CrispOptions::default());
    assert_eq!(
        (report.time_saved_on_cp_ns, report.time_saved_on_work_ns),
        (20, 40)
    );
}
