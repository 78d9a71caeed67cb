//! Run storage round trip, clock mapping and span↔thread activity.

use crate::common::testdata;

use std::io::Write;

use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::model::{
    Activation, Attributes, Event, Value, ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_TID,
    EVENT_OFF, EVENT_ON,
};
use deepspan_spans::store::{read_run_spans, span_files};
use deepspan_spans::{
    import_file, import_into_run, ClockMap, Format, Span, SpanId, SpanRef, SpanWriter, SyncEvent,
    SyncKind, ThreadActivity, TraceId,
};

#[test]
fn run_storage_round_trip_and_append() {
    let run = tempfile::tempdir().unwrap();
    let inputs = vec![
        testdata("zipkin/yelp.json"),
        testdata("otlp/otlp2jaeger/otlp2jaeger-in.json"),
        testdata("jaeger/tracecompass-opentracing/simple.json"),
    ];
    let originals: Vec<Span> = inputs
        .iter()
        .flat_map(|p| import_file(p).unwrap().spans)
        .collect();
    let r = import_into_run(&inputs, run.path()).unwrap();
    assert!(
        r.file.ends_with("spans/otlp-000.pb"),
        "{}",
        r.file.display()
    );
    assert_eq!(r.inputs.iter().map(|i| i.2).sum::<usize>(), originals.len());
    let back: Vec<Span> = read_run_spans(run.path())
        .unwrap()
        .map(|s| s.unwrap())
        .collect();
    assert_eq!(
        back, originals,
        "spans survive OTLP protobuf storage unchanged"
    );

    // A second writer (say the receiver) gets its own file; the reader sees both in order.
    let mut w = SpanWriter::create(run.path()).unwrap();
    assert!(w.path().ends_with("spans/otlp-001.pb"));
    w.append(&originals[..3]).unwrap();
    w.flush().unwrap();
    assert_eq!(span_files(run.path()).unwrap().len(), 2);
    let all: Vec<Span> = read_run_spans(run.path())
        .unwrap()
        .map(|s| s.unwrap())
        .collect();
    assert_eq!(all.len(), originals.len() + 3);
    // import_file on the run folder and on a single storage file.
    let imp = import_file(run.path()).unwrap();
    assert_eq!(imp.spans.len(), originals.len() + 3);
    let one = import_file(&run.path().join("spans/otlp-001.pb")).unwrap();
    assert_eq!(one.format, Format::OtlpProtobufStream);
    assert_eq!(one.spans, originals[..3].to_vec());
}

/// A writer killed mid-record leaves the file cut anywhere in its last
/// record: every cut gives all the whole records back plus one note naming
/// the file and offset, never an error. A cut inside an earlier record makes
/// that record the (truncated) last one, so the same holds.
#[test]
fn truncated_last_record_is_skipped_with_a_note_at_every_cut() {
    let run = tempfile::tempdir().unwrap();
    let spans = import_file(&testdata("zipkin/messaging.json"))
        .unwrap()
        .spans;
    // Record boundaries, from the file size after each record.
    let mut ends = vec![0u64];
    let path = {
        let mut w = SpanWriter::create(run.path()).unwrap();
        for chunk in spans.chunks(2).take(4) {
            w.append(chunk).unwrap();
            w.flush().unwrap();
            ends.push(std::fs::metadata(w.path()).unwrap().len());
        }
        w.path().to_path_buf()
    };
    let whole = std::fs::read(&path).unwrap();
    let spans_in = |records: usize| spans.chunks(2).take(records).flatten().count();
    let last = ends.len() - 2;
    let earlier = [ends[1] + 1, ends[1] + 2, ends[2] - 1];
    let cuts = (ends[last] + 1..ends[last + 1]).chain(earlier);
    let mut checked = 0;
    for cut in cuts {
        std::fs::write(&path, &whole[..cut as usize]).unwrap();
        let complete = ends.iter().filter(|&&e| e > 0 && e <= cut).count();
        let start = ends[complete];
        let mut reader = read_run_spans(run.path()).unwrap();
        let read: Vec<Span> = reader.by_ref().map(|s| s.unwrap()).collect();
        assert_eq!(read.len(), spans_in(complete), "cut at {cut}");
        assert_eq!(
            read,
            spans
                .chunks(2)
                .take(complete)
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
        );
        assert_eq!(
            reader.warnings.len(),
            1,
            "cut at {cut}: {:?}",
            reader.warnings
        );
        let note = &reader.warnings[0];
        let expected = format!(
            "otlp-000.pb: the last record (record {complete}, at byte {start}) is truncated: {} bytes present",
            cut - start
        );
        assert!(
            note.contains(&expected),
            "cut at {cut}: {note}\nexpected {expected}"
        );
        checked += 1;
    }
    assert!(
        checked > 100,
        "the last record should be long: {checked} cuts"
    );

    // A record that is whole but not OTLP stays an error naming file and offset.
    let mut corrupt = whole.clone();
    let second = ends[1] as usize;
    corrupt[second + 2..second + 6].fill(0xff);
    std::fs::write(&path, &corrupt).unwrap();
    let items: Vec<_> = read_run_spans(run.path()).unwrap().collect();
    let err = items.last().unwrap().as_ref().unwrap_err().to_string();
    assert!(
        err.contains("otlp-000.pb") && err.contains(&format!("record 1 at byte {second}")),
        "{err}"
    );
    // Garbage appended to a good file: an error naming the record, no panic.
    std::fs::write(&path, &whole).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(&[0xff; 12]).unwrap();
    let err = read_run_spans(run.path())
        .unwrap()
        .find_map(|r| r.err())
        .unwrap()
        .to_string();
    assert!(err.contains("not a valid varint"), "{err}");
}

/// A length field claiming gigabytes in a small file costs no memory: the
/// reader takes only the bytes present and reports the record as truncated.
#[test]
fn a_huge_record_length_allocates_only_what_the_file_holds() {
    use deepspan_spans::store::RecordReader;
    // Varint 0x7fff_ffff (2 GiB - 1), then 5 bytes.
    let bytes = [0xff, 0xff, 0xff, 0xff, 0x07, 1, 2, 3, 4, 5];
    let mut reader = RecordReader::from_reader(std::path::Path::new("big.pb"), &bytes[..]);
    assert!(reader.next().is_none());
    assert_eq!(reader.warnings.len(), 1);
    assert!(
        reader.warnings[0].contains("10 bytes present, the record needs 2147483652"),
        "{}",
        reader.warnings[0]
    );
    // Beyond 2 GiB the length itself is corruption: an error.
    let bytes = [0xff, 0xff, 0xff, 0xff, 0x7f, 1];
    let mut reader = RecordReader::from_reader(std::path::Path::new("big.pb"), &bytes[..]);
    let err = reader.next().unwrap().unwrap_err().to_string();
    assert!(
        err.contains("record 0 at byte 0") && err.contains("implausible"),
        "{err}"
    );
}

#[test]
fn clock_map_interpolates_extrapolates_and_states_precision() {
    // Realtime runs 100 ppm fast relative to mono, offset 1e18.
    let pairs: Vec<(u64, u64)> = (0..5u64)
        .map(|i| {
            (
                1_000_000_000_000_000_000 + i * 1_000_100_000,
                5_000_000_000 + i * 1_000_000_000,
            )
        })
        .collect();
    let m = ClockMap::new(&pairs).unwrap();
    assert_eq!(m.wall_to_mono(pairs[2].0), pairs[2].1);
    // Midway between samples 1 and 2.
    assert_eq!(
        m.wall_to_mono(pairs[1].0 + 500_050_000),
        pairs[1].1 + 500_000_000
    );
    // Before the first / after the last sample: the end segments extended.
    assert_eq!(
        m.wall_to_mono(pairs[0].0 - 1_000_100_000),
        pairs[0].1 - 1_000_000_000
    );
    assert_eq!(
        m.wall_to_mono(pairs[4].0 + 1_000_100),
        pairs[4].1 + 1_000_000
    );
    // Perfectly linear samples: the precision is the read-uncertainty floor.
    assert_eq!(
        m.precision_ns(),
        deepspan_spans::clock::SAMPLE_READ_UNCERTAINTY_NS
    );
    // A 50 µs bend in the middle sample shows up as the stated precision.
    let mut bent = pairs.clone();
    bent[2].1 += 50_000;
    assert_eq!(ClockMap::new(&bent).unwrap().precision_ns(), 50_000);
    // A realtime step backwards is left out and said.
    let mut stepped = pairs.clone();
    stepped[3].0 = stepped[1].0 - 5;
    let s = ClockMap::new(&stepped).unwrap();
    assert_eq!(s.notes.len(), 1);
    assert!(ClockMap::new(&[]).is_err());

    // From a manifest, and spans: deepspan fields are used as they are.
    let run = tempfile::tempdir().unwrap();
    std::fs::write(
        run.path().join("manifest.json"),
        serde_json::json!({"clock_samples": pairs}).to_string(),
    )
    .unwrap();
    let m = ClockMap::from_manifest(run.path()).unwrap();
    let mut sp = Span::new(TraceId(1), SpanId(2), None, "x", pairs[1].0, pairs[2].0);
    let t = m.span_mono(&sp);
    assert_eq!(
        (t.start_ns, t.end_ns, t.exact),
        (pairs[1].1, pairs[2].1, false)
    );
    sp.attributes.insert(ATTR_MONO_START, Value::Int(7));
    sp.attributes.insert(ATTR_MONO_END, Value::Int(9));
    sp.refresh_sync();
    let t = m.span_mono(&sp);
    assert_eq!(
        (t.start_ns, t.end_ns, t.exact, t.precision_ns),
        (7, 9, true, 0)
    );
    std::fs::write(
        run.path().join("manifest.json"),
        r#"{"clock_samples": [[1, "x"]]}"#,
    )
    .unwrap();
    let e = ClockMap::from_manifest(run.path()).unwrap_err().to_string();
    assert!(
        e.contains("manifest.json") && e.contains("clock_samples[0]"),
        "{e}"
    );
}

fn r(n: u64) -> SpanRef {
    SpanRef {
        trace_id: TraceId(n as u128),
        span_id: SpanId(n),
    }
}

fn ev(ts: u64, tid: u32, span: u64, kind: SyncKind) -> SyncEvent {
    SyncEvent {
        ts,
        tid,
        span: r(span),
        kind,
    }
}

#[test]
fn nested_spans_paper_style() {
    // Algorithm 1: A starts, B starts inside it, B ends, A ends, on thread 10.
    let a = ThreadActivity::from_sync_events(vec![
        ev(100, 10, 1, SyncKind::SpanStart { parent: None }),
        ev(
            200,
            10,
            2,
            SyncKind::SpanStart {
                parent: Some(SpanId(1)),
            },
        ),
        ev(300, 10, 2, SyncKind::SpanEnd),
        ev(400, 10, 1, SyncKind::SpanEnd),
    ]);
    assert_eq!(a.active_at(10, 99), None);
    assert_eq!(a.active_at(10, 100), Some(r(1)));
    assert_eq!(a.active_at(10, 250), Some(r(2)));
    assert_eq!(a.held_at(10, 250), &[r(1), r(2)]);
    assert_eq!(a.active_at(10, 300), Some(r(1)));
    assert_eq!(a.active_at(10, 400), None);
    assert_eq!(a.held_during(10, 0, 1000), vec![r(1), r(2)]);
    assert_eq!(a.held_during(10, 320, 1000), vec![r(1)]);
    assert_eq!(
        a.active_during(10, 0, 1000),
        vec![(100, 200, r(1)), (200, 300, r(2)), (300, 400, r(1))]
    );
    assert_eq!(a.active_at(11, 250), None);
    assert!(a.notes.is_empty(), "{:?}", a.notes);
}

#[test]
fn interleaved_requests_on_one_thread_asyncio_style() {
    // Two requests started on thread 5 by an SDK reporting activations:
    // A runs, yields, B runs, yields, A resumes, A ends, B resumes, B ends.
    let a = ThreadActivity::from_sync_events(vec![
        ev(10, 5, 1, SyncKind::Hold),
        ev(10, 5, 1, SyncKind::On),
        ev(20, 5, 1, SyncKind::Off),
        ev(21, 5, 2, SyncKind::Hold),
        ev(21, 5, 2, SyncKind::On),
        ev(30, 5, 2, SyncKind::Off),
        ev(35, 5, 1, SyncKind::On),
        ev(40, 5, 1, SyncKind::Off),
        ev(40, 5, 1, SyncKind::SpanEnd),
        ev(45, 5, 2, SyncKind::On),
        ev(50, 5, 2, SyncKind::Off),
        ev(50, 5, 2, SyncKind::SpanEnd),
    ]);
    assert_eq!(a.active_at(5, 15), Some(r(1)));
    assert_eq!(a.active_at(5, 20), None, "between steps nobody is active");
    assert_eq!(a.held_at(5, 20), &[r(1)]);
    assert_eq!(a.active_at(5, 25), Some(r(2)));
    assert_eq!(a.held_at(5, 25), &[r(1), r(2)]);
    assert_eq!(a.active_at(5, 32), None);
    assert_eq!(a.active_at(5, 36), Some(r(1)));
    assert_eq!(a.held_at(5, 42), &[r(2)]);
    assert_eq!(a.active_at(5, 47), Some(r(2)));
    assert_eq!(
        a.active_during(5, 0, 100),
        vec![
            (10, 20, r(1)),
            (21, 30, r(2)),
            (35, 40, r(1)),
            (45, 50, r(2))
        ]
    );
}

#[test]
fn spans_of_the_nodejs_processor_are_active_from_start_to_end() {
    // deepspan's Node.js processor gives `deepspan.tid` and monotonic times
    // but no activations (Node's async context has no hook for it): its
    // spans work for their thread from start to end, nested as the
    // paper's. The same span from an SDK that reports activations only
    // holds its thread.
    let span = |language: &str| {
        let mut s = Span::new(TraceId(4), SpanId(4), None, "GET", 0, 0);
        s.attributes.insert(ATTR_TID, Value::Int(12));
        s.attributes.insert(ATTR_MONO_START, Value::Int(100));
        s.attributes.insert(ATTR_MONO_END, Value::Int(300));
        std::sync::Arc::make_mut(&mut s.resource)
            .attributes
            .insert("telemetry.sdk.language", Value::String(language.into()));
        s.refresh_sync();
        s
    };
    let node = span("nodejs");
    let a = ThreadActivity::from_spans([&node], None, ActivityOptions::default());
    assert_eq!(a.active_at(12, 150), Some(SpanRef::of(&node)));
    assert_eq!(a.active_at(12, 300), None);
    let python = span("python");
    let a = ThreadActivity::from_spans([&python], None, ActivityOptions::default());
    assert_eq!(a.active_at(12, 150), None);
    assert_eq!(a.held_at(12, 150), &[SpanRef::of(&python)]);
}

#[test]
fn migrating_span_from_spans_with_activation_events() {
    // A span started on thread 1, handed to a pool worker (thread 2), then back.
    let mut s = Span::new(TraceId(9), SpanId(9), None, "req", 0, 0);
    s.attributes.insert(ATTR_TID, Value::Int(1));
    s.attributes.insert(ATTR_MONO_START, Value::Int(100));
    s.attributes.insert(ATTR_MONO_END, Value::Int(500));
    let act = |name: &str, tid: i64, ns: i64| Event {
        name: name.to_string(),
        time_ns: 0,
        attributes: Attributes(vec![
            (ATTR_TID.into(), Value::Int(tid)),
            (ATTR_MONO_NS.into(), Value::Int(ns)),
        ]),
    };
    s.events = vec![
        act(EVENT_ON, 1, 100),
        act(EVENT_OFF, 1, 150),
        act(EVENT_ON, 2, 160),
        act(EVENT_OFF, 2, 300),
        act(EVENT_ON, 1, 310),
        act(EVENT_OFF, 1, 490),
    ];
    s.refresh_sync();
    assert_eq!(
        s.sync.activations[2],
        Activation {
            tid: 2,
            mono_ns: 160,
            on: true
        }
    );
    // A child span started and made current on thread 2 while the request is there;
    // the request's own activation on thread 2 stays open underneath (nesting).
    let mut c = Span::new(TraceId(9), SpanId(10), Some(SpanId(9)), "db", 0, 0);
    c.attributes.insert(ATTR_TID, Value::Int(2));
    c.attributes.insert(ATTR_MONO_START, Value::Int(200));
    c.attributes.insert(ATTR_MONO_END, Value::Int(250));
    c.events = vec![act(EVENT_ON, 2, 201), act(EVENT_OFF, 2, 249)];
    c.refresh_sync();
    let a = ThreadActivity::from_spans([&s, &c], None, ActivityOptions::default());
    let req = SpanRef::of(&s);
    let db = SpanRef::of(&c);
    assert_eq!(a.threads(), vec![1, 2]);
    assert_eq!(a.active_at(1, 120), Some(req));
    assert_eq!(
        a.active_at(1, 200),
        None,
        "thread 1 holds the request but works for nobody"
    );
    assert_eq!(a.held_at(1, 200), &[req]);
    assert_eq!(a.active_at(2, 170), Some(req));
    assert_eq!(
        a.active_at(2, 200),
        Some(req),
        "started but not yet current"
    );
    assert_eq!(a.active_at(2, 220), Some(db));
    assert_eq!(a.held_at(2, 220), &[db, req]);
    assert_eq!(
        a.active_at(2, 249),
        Some(req),
        "the child's activation ended, the request's is back on top"
    );
    assert_eq!(a.active_at(2, 260), Some(req));
    assert_eq!(a.active_at(2, 305), None);
    assert_eq!(a.active_at(1, 400), Some(req));
    assert_eq!(a.active_at(1, 495), None);
    assert_eq!(a.held_at(1, 500), &[] as &[SpanRef]);
    assert!(a.notes.is_empty(), "{:?}", a.notes);

    // thread.id is used only when the caller says it is an OS tid; wall times go through the clock.
    let mut t = Span::new(TraceId(3), SpanId(3), None, "plain", 1_000, 2_000);
    t.attributes.insert("thread.id", Value::Int(77));
    t.refresh_sync();
    let clock = ClockMap::new(&[(0, 10)]).unwrap();
    // (A span with only wall times and thread.id is the paper's kind: active from start to end.)
    let no = ThreadActivity::from_spans([&t], Some(&clock), ActivityOptions::default());
    assert!(no.threads().is_empty());
    assert_eq!(no.notes.len(), 1);
    let yes = ThreadActivity::from_spans(
        [&t],
        Some(&clock),
        ActivityOptions {
            thread_id_is_os_tid: true,
        },
    );
    assert_eq!(yes.active_at(77, 1_010), Some(SpanRef::of(&t)));
    assert_eq!(yes.active_at(77, 2_010), None);
}
