//! Each stage of [`analyze_run`](crate::analyze_run) called alone, on a
//! real LTTng kernel trace: Trace Compass's `bug446190` test trace (an ARM
//! board running weston, 31 556 events over 6 s), imported as
//! `deepspan import --ctf` would (`kernel/ctf/`), with spans laid by hand
//! on what its threads did, carrying the SDK's fields in the trace's clock.
//!
//! What the trace shows (`deepspan decode` of it), 1 412 670 963 s plus:
//! - weston-desktop- (tid 340) sleeps, is woken at 786.280 ms, runs from
//!   786.302 ms, wakes weston (tid 338) at 786.955 ms and sleeps again at
//!   786.985 ms;
//! - weston, asleep until then, waits for a CPU until 786.974 ms and runs
//!   until 787.149 ms;
//! - weston-desktop- runs again for 0.1 to 0.6 ms at 797.58, 821.18 and
//!   833.34 ms.
//!
//! The spans: a weston `frame` over 786.000-787.149 ms, whose first 0.95 ms
//! weston waits for weston-desktop-; four weston-desktop- `compose` spans,
//! one over that wake-up (its start chosen by [`Fixture::new`]) and three
//! around the later runs; a span without the SDK's fields (the run has no
//! clock mapping, so it cannot be placed); and the `frame` span twice.

use std::path::{Path, PathBuf};

use deepspan_analysis::{Cause, CulpritKind, EdgeType, RootCause, SyncSource, ThreadState};
use deepspan_spans::model::{
    Attributes, Event, Resource, Value, ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_TID,
    EVENT_OFF, EVENT_ON,
};
use deepspan_spans::{Span, SpanId, SpanWriter, TraceId};
use deepspan_store::table::{read_rows, Cell};

use super::*;
use crate::NoProgress;

/// The second of the trace the spans are in, in ns.
const SECOND: u64 = 1_412_670_963_000_000_000;
const MS: u64 = 1_000_000;
const WESTON: Tid = 338;
const DESKTOP: Tid = 340;
/// weston-desktop- wakes weston.
const WAKE: u64 = SECOND + 786_954_939;
/// weston, woken, gets a CPU.
const WESTON_RUNS: u64 = SECOND + 786_973_939;
/// weston-desktop-, woken by a timer, gets a CPU.
const DESKTOP_RUNS: u64 = SECOND + 786_302_039;

const FRAME: u64 = 1;
const COMPOSE: u64 = 2;
const UNPLACED: u64 = 9;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/kernel/ctf/bug446190")
}

/// A run folder holding the trace and the spans.
struct Fixture {
    _dir: tempfile::TempDir,
    run: PathBuf,
}

impl Fixture {
    /// The spans described above, the `compose` span over the wake-up
    /// starting `compose_start_ms` into the second.
    fn new(compose_start_ms: u64) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = dir.path().join("run");
        let files = deepspan_run::Run::new(&run);
        std::fs::create_dir_all(files.kernel_dir()).expect("kernel folder");
        std::os::unix::fs::symlink(corpus().join("trace"), files.ctf_dir())
            .expect("link the CTF trace");
        let at = |ms_in_second: f64| SECOND + (ms_in_second * MS as f64) as u64;
        let spans = vec![
            on_thread(FRAME, "weston", "frame", WESTON, at(786.0), at(787.149_339)),
            on_thread(
                COMPOSE,
                "desktop",
                "compose",
                DESKTOP,
                SECOND + compose_start_ms * MS,
                at(786.99),
            ),
            on_thread(3, "desktop", "compose", DESKTOP, at(797.57), at(797.67)),
            on_thread(4, "desktop", "compose", DESKTOP, at(821.18), at(821.77)),
            on_thread(5, "desktop", "compose", DESKTOP, at(833.335), at(833.42)),
            Span::new(
                TraceId(UNPLACED as u128),
                SpanId(UNPLACED),
                None,
                "elsewhere",
                1,
                2,
            ),
            on_thread(FRAME, "weston", "frame", WESTON, at(786.0), at(787.149_339)),
        ];
        let mut writer = SpanWriter::create(&run).expect("span file");
        writer.append(&spans).expect("write spans");
        writer.flush().expect("flush spans");
        Fixture { _dir: dir, run }
    }
}

/// A root span of its own trace (`id`), started by `tid` and current on
/// it from start to end, with the SDK's fields (times in the trace's
/// clock), as deepspan's span processor reports them.
fn on_thread(id: u64, service: &str, name: &str, tid: Tid, start: u64, end: u64) -> Span {
    let mut span = Span::new(TraceId(id as u128), SpanId(id), None, name, start, end);
    span.resource = std::sync::Arc::new(Resource::with_service(service, Attributes::default()));
    span.attributes.insert(ATTR_TID, Value::Int(tid.into()));
    span.attributes
        .insert(ATTR_MONO_START, Value::Int(start as i64));
    span.attributes
        .insert(ATTR_MONO_END, Value::Int(end as i64));
    for (event, at) in [(EVENT_ON, start), (EVENT_OFF, end)] {
        let mut attributes = Attributes::default();
        attributes.insert(ATTR_TID, Value::Int(tid.into()));
        attributes.insert(ATTR_MONO_NS, Value::Int(at as i64));
        span.events.push(Event {
            name: event.into(),
            time_ns: at,
            attributes,
        });
    }
    span.refresh_sync();
    span
}

fn opened(run: &Path, options: &AnalyzeOptions) -> (Inputs, Vec<String>) {
    let mut notes = Vec::new();
    let inputs = open_inputs(run, options, &mut notes).expect("open the run");
    (inputs, notes)
}

/// The stages up to [`place_spans`].
fn placed(run: &Path) -> (Kernel, Placed) {
    let options = AnalyzeOptions::default();
    let (inputs, mut notes) = opened(run, &options);
    let kernel = build_kernel(run, &inputs, &NoProgress, &mut notes).expect("model");
    let placed = place_spans(run, &options, inputs, &kernel, &mut notes);
    (kernel, placed)
}

/// The stages up to [`critical_paths`], with the staging folder.
fn up_to_paths(run: &Path) -> (Kernel, Placed, Staging, Paths) {
    let (kernel, placed) = placed(run);
    let staging = Staging::new(run).expect("staging folder");
    let paths = critical_paths(&staging, &kernel, &placed, None, &NoProgress).expect("paths");
    (kernel, placed, staging, paths)
}

fn span_idx(placed: &Placed, id: u64) -> SpanIdx {
    placed.index[&SpanRef {
        trace_id: TraceId(id as u128),
        span_id: SpanId(id),
    }]
}

fn record<'r>(records: &'r [RequestRecord], placed: &Placed, id: u64) -> &'r RequestRecord {
    let idx = span_idx(placed, id);
    records
        .iter()
        .find(|r| r.path.request == idx)
        .unwrap_or_else(|| panic!("no request of span {id}"))
}

#[test]
fn open_inputs_reads_each_span_once_and_opens_the_ctf_trace() {
    let fixture = Fixture::new(785);
    let (inputs, notes) = opened(&fixture.run, &AnalyzeOptions::default());
    assert_eq!(inputs.spans.len(), 6, "the frame span is written twice");
    assert!(
        notes.iter().any(|n| n.starts_with("1 duplicate span(s)")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.starts_with("no clock mapping")),
        "{notes:?}"
    );
    assert!(inputs.clock.is_none());
    assert!(inputs.recorder_tids.is_empty(), "no manifest, no recorder");
    assert!(matches!(inputs.trace, KernelTrace::Ctf { .. }));
    assert_eq!(
        inputs.trace.path(),
        deepspan_run::Run::new(&fixture.run).ctf_dir()
    );
    let frame = &inputs.spans[0];
    assert_eq!(frame.sync.tid, Some(WESTON as u32));

    // Placement from the trace alone: the spans lose the SDK's fields here.
    let inferred = AnalyzeOptions {
        placement: PlacementMode::Inferred,
        ..AnalyzeOptions::default()
    };
    let (inputs, _) = opened(&fixture.run, &inferred);
    assert!(inputs.spans.iter().all(|s| s.sync == Default::default()));
}

#[test]
fn open_inputs_refuses_a_folder_without_a_kernel_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mut notes = Vec::new();
    let err = open_inputs(dir.path(), &AnalyzeOptions::default(), &mut notes)
        .err()
        .expect("no kernel trace");
    assert!(err.to_string().contains("kernel"), "{err}");
    let err = open_inputs(
        &dir.path().join("none"),
        &AnalyzeOptions::default(),
        &mut notes,
    )
    .err()
    .expect("no folder");
    assert!(matches!(err, Error::NotARunFolder { .. }), "{err}");
}

#[test]
fn build_kernel_models_every_event_and_the_threads_of_the_trace() {
    let fixture = Fixture::new(785);
    let options = AnalyzeOptions::default();
    let (inputs, mut notes) = opened(&fixture.run, &options);
    let kernel = build_kernel(&fixture.run, &inputs, &NoProgress, &mut notes).expect("model");

    // The upstream oracle's event count (CtfTestTrace.ARM_64_BIT_HEADER).
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(corpus().join("expected.json")).unwrap()).unwrap();
    let events = expected["oracle"]["event_count"].as_u64().unwrap();
    assert_eq!(kernel.model.stats().events, events);
    assert_eq!(kernel.lost.total(), 0);
    assert_eq!(kernel.trace_file, "kernel/ctf");

    // The upstream critical-path test's threads, by name.
    let name = |tid: Tid| {
        kernel
            .model
            .thread(tid)
            .and_then(|t| t.name_at(WAKE))
            .map(|c| c.to_string_lossy())
    };
    assert_eq!(name(WESTON).as_deref(), Some("weston"));
    assert_eq!(name(DESKTOP).as_deref(), Some("weston-desktop-"));

    // Between its wake-up and its switch-in weston waits for a CPU; it is
    // blocked before and running after.
    let weston = kernel.model.thread(WESTON).unwrap();
    let state = |ts: u64| weston.state_at(ts).map(|s| s.state);
    assert!(matches!(state(WAKE - 1), Some(ThreadState::Blocked(_))));
    assert_eq!(state(WAKE + 1), Some(ThreadState::WaitCpu));
    assert_eq!(state(WESTON_RUNS + 1), Some(ThreadState::Running));
}

#[test]
fn place_spans_puts_each_span_with_the_sdk_fields_on_its_thread() {
    let fixture = Fixture::new(785);
    let (_, placed) = placed(&fixture.run);
    assert_eq!(placed.spans.len(), 6);
    assert_eq!(placed.metas.len(), 6);
    let input = |id| &placed.span_inputs[span_idx(&placed, id) as usize];
    let frame = input(FRAME);
    assert_eq!(frame.holder, Some(WESTON));
    assert_eq!(frame.times, Some((SECOND + 786 * MS, SECOND + 787_149_339)));
    assert!(frame.exact_times);
    assert_eq!(input(COMPOSE).holder, Some(DESKTOP));
    // No SDK fields and no clock mapping: no time on the kernel clock, and
    // a thread is never invented.
    let unplaced = input(UNPLACED);
    assert_eq!(unplaced.times, None);
    assert!(unplaced.holder.is_none() || unplaced.inferred.is_some());
    assert!(placed.clock.is_none());
    assert_eq!(
        placed.metas[span_idx(&placed, FRAME) as usize].service,
        "weston"
    );
}

#[test]
fn critical_paths_cover_each_request_and_name_the_request_it_waited_for() {
    let fixture = Fixture::new(785);
    let (_, placed, staging, paths) = up_to_paths(&fixture.run);
    assert_eq!(paths.records.len(), 6, "every request has a record");
    let frame = record(&paths.records, &placed, FRAME);
    let compose = span_idx(&placed, COMPOSE);
    let d = frame.diagnosis.as_ref().expect("frame diagnosed");
    assert_eq!(d.cause, Cause::BlockedByRequest, "{d:?}");
    assert!(
        d.culprits
            .iter()
            .any(|c| c.kind == CulpritKind::Request && c.span == Some(compose)),
        "{d:?}"
    );
    assert_eq!(
        record(&paths.records, &placed, UNPLACED).path.sync,
        SyncSource::None
    );

    // Each request's rows, as its record gives them, are all the table's
    // rows of its span, and only those.
    let table = staging.file(analysis::CRITICAL_PATH);
    let runs = deepspan_store::rows::text_runs(&table, "span_id").expect("span ids");
    assert!(paths.records.len() >= 2);
    for rec in &paths.records {
        let rows = rec.path_rows.clone().expect("rows of a written path");
        let span = deepspan_store::span_hex(placed.metas[rec.path.request as usize].span_id);
        let of_span: Vec<_> = runs
            .iter()
            .filter(|(id, _)| *id == span)
            .map(|(_, r)| r.clone())
            .collect();
        // A request placed nowhere (no path) has no rows.
        let expected: Vec<_> = Some(rows).filter(|r| !r.is_empty()).into_iter().collect();
        assert_eq!(of_span, expected, "{span}");
    }
    assert!(paths
        .records
        .iter()
        .any(|r| r.path_rows.as_ref().is_some_and(|rows| !rows.is_empty())));

    // The frame's pieces in the table tile its span; until the wake-up
    // they are weston-desktop-'s, working for the compose request.
    let rows = read_rows(&staging.file(analysis::CRITICAL_PATH), |row| {
        row.iter()
            .any(|(k, c)| k == "span_id" && *c == Cell::Str(deepspan_store::span_hex(FRAME)))
    })
    .expect("critical_path table");
    let get = |row: &[(String, Cell)], key: &str| {
        row.iter()
            .find(|(k, _)| k == key)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("no column {key}"))
    };
    let mut at = frame.path.start;
    for row in &rows {
        assert_eq!(get(row, "start_ns").as_u64(), Some(at), "{rows:?}");
        at = get(row, "end_ns").as_u64().unwrap();
    }
    assert_eq!(at, frame.path.end, "{rows:?}");
    let before_wake = rows
        .iter()
        .filter(|r| get(r, "end_ns").as_u64().unwrap() <= WAKE)
        .collect::<Vec<_>>();
    assert!(!before_wake.is_empty());
    for row in before_wake {
        assert_eq!(get(row, "tid").as_i64(), Some(DESKTOP.into()), "{row:?}");
        assert_eq!(
            get(row, "blocked_by_request"),
            Cell::Str(deepspan_store::span_hex(COMPOSE)),
            "{row:?}"
        );
    }
    let last = rows.last().unwrap();
    assert_eq!(get(last, "tid").as_i64(), Some(WESTON.into()));
    assert_eq!(
        get(last, "state"),
        Cell::Str(EdgeType::Running.name().into())
    );
}

/// The frame's root cause, with the number of `key` in its evidence.
fn frame_root(compose_start_ms: u64) -> (RootCause, impl Fn(&str) -> f64) {
    let fixture = Fixture::new(compose_start_ms);
    let (kernel, placed, _staging, mut paths) = up_to_paths(&fixture.run);
    rank_and_baseline(&mut paths.records, &placed.metas);
    root_causes(&mut paths, &kernel, &placed);
    let compose = record(&paths.records, &placed, COMPOSE);
    let compose_diagnosis = compose.diagnosis.as_ref().unwrap();
    assert!(
        compose_diagnosis.root.is_none(),
        "compose waited for no request"
    );
    assert_eq!(compose.anomalous, compose_start_ms < 786);
    let frame = record(&paths.records, &placed, FRAME);
    let d = frame.diagnosis.as_ref().unwrap();
    assert_eq!(d.cause, Cause::BlockedByRequest, "{d:?}");
    let root = *d.root.clone().expect("the frame waited for a request");
    assert!(
        root.chain
            .starts_with("[weston] frame → behind [desktop] compose → "),
        "{root:?}"
    );
    let evidence = root.evidence.clone();
    let number = move |key: &str| {
        evidence
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {key} in {evidence:?}"))
    };
    (root, number)
}

#[test]
fn root_causes_look_into_a_held_up_blocker_only() {
    // The frame waited from 786.0 ms until weston-desktop- woke it.
    let waited = (WAKE - (SECOND + 786 * MS)) as f64;

    // The compose span over the wake-up lasts 2 ms where the others last
    // 0.1-0.6 ms: it was held up, so what it did while the frame waited
    // is looked into: a timer until 786.280 ms, a CPU from 786.302 ms, and
    // the root cause is its running, from then to the wake-up.
    let (root, number) = frame_root(785);
    assert_eq!(number("blocked_ns"), waited, "{root:?}");
    assert_eq!(number("ns"), (WAKE - DESKTOP_RUNS) as f64, "{root:?}");
    assert!(root.chain.contains("→ RUNNING"), "{root:?}");
    let culprit = root.culprits[0].comm.map(|c| c.to_string_lossy());
    assert_eq!(culprit.as_deref(), Some("weston-desktop-"), "{root:?}");

    // Over the same wake-up but of a usual length (0.99 ms is not well
    // above 0.085 ms + 1 ms), it held nobody up: all the frame's wait was
    // work it had to wait for.
    let (root, number) = frame_root(786);
    assert_eq!(number("blocked_ns"), waited, "{root:?}");
    assert_eq!(number("ns"), waited, "{root:?}");
}

#[test]
fn write_tables_swaps_in_the_analysis_that_reads_back_as_written() {
    let fixture = Fixture::new(785);
    let (kernel, placed, staging, mut paths) = up_to_paths(&fixture.run);
    rank_and_baseline(&mut paths.records, &placed.metas);
    root_causes(&mut paths, &kernel, &placed);
    let notes = vec!["a note".to_string()];
    let (dir, kept) = write_tables(staging, &kernel, &placed, &paths.records, &notes, None)
        .expect("tables written");
    assert!(kept.is_none(), "nothing asked to be kept");
    let files = deepspan_run::Run::new(&fixture.run);
    assert_eq!(dir, files.analysis_dir());
    for table in [
        analysis::REQUESTS_JSON,
        analysis::PLACEMENTS_JSON,
        analysis::THREAD_STATES,
        analysis::STATE_HISTORY,
        analysis::SYSCALLS,
        analysis::REQUESTS,
        analysis::CRITICAL_PATH,
        analysis::REQUEST_SUMMARY,
        analysis::REQUEST_SYSCALLS,
        analysis::OPERATION_SUMMARY,
        analysis::DIAGNOSES,
        analysis::CONTAINERS,
    ] {
        assert!(dir.join(table).is_file(), "no {table}");
    }
    let doc = deepspan_store::json::read_requests_json(&fixture.run).expect("requests.json");
    assert_eq!(doc.notes, notes);
    let read: Vec<(String, u64, Option<Cause>)> = doc
        .requests
        .iter()
        .map(|r| {
            (
                r.span_id.clone(),
                r.duration_ns,
                r.diagnosis.as_ref().map(|d| d.cause),
            )
        })
        .collect();
    let written: Vec<(String, u64, Option<Cause>)> = paths
        .records
        .iter()
        .map(|r| {
            (
                deepspan_store::span_hex(placed.metas[r.path.request as usize].span_id),
                r.path.duration(),
                r.diagnosis.as_ref().map(|d| d.cause),
            )
        })
        .collect();
    assert_eq!(read, written);

    // `report` reads a request's rows where the requests table says they
    // are; each request's pieces tile its span.
    let mut reported = 0;
    for rec in &paths.records {
        let span = deepspan_store::span_hex(placed.metas[rec.path.request as usize].span_id);
        let report = deepspan_store::read_report(&fixture.run, &span).expect("report");
        let pieces = &report.critical_path;
        if rec.path_rows.as_ref().is_none_or(|rows| rows.is_empty()) {
            assert!(pieces.is_empty(), "{span}");
            continue;
        }
        reported += 1;
        assert_eq!(
            pieces.first().map(|p| p.start_ns),
            Some(rec.path.start),
            "{span}"
        );
        assert_eq!(
            pieces.last().map(|p| p.end_ns),
            Some(rec.path.end),
            "{span}"
        );
        assert!(
            pieces.windows(2).all(|w| w[0].end_ns == w[1].start_ns),
            "{span}"
        );
    }
    assert!(reported >= 2);
}

/// The state history answers every question as a scan of the
/// `thread_states` table written beside it: each thread's lane is its rows
/// in time order, the state at a time is the row that holds it, a window is
/// the rows that overlap it, and a CPU's lane is its RUNNING rows.
#[test]
fn the_state_history_answers_as_a_scan_of_thread_states() {
    use deepspan_store::history::{History, LaneKey, NO_STRING};
    use deepspan_store::rows::for_each_row;
    use deepspan_store::tables::ThreadStateRow;
    use std::collections::BTreeMap;

    let fixture = Fixture::new(785);
    let (kernel, placed, staging, mut paths) = up_to_paths(&fixture.run);
    rank_and_baseline(&mut paths.records, &placed.metas);
    root_causes(&mut paths, &kernel, &placed);
    let (dir, _) =
        write_tables(staging, &kernel, &placed, &paths.records, &[], None).expect("tables written");
    let mut rows: BTreeMap<i32, Vec<ThreadStateRow>> = BTreeMap::new();
    for_each_row(&dir.join(analysis::THREAD_STATES), |r: ThreadStateRow| {
        rows.entry(r.tid).or_default().push(r)
    })
    .expect("thread_states");
    for lane in rows.values_mut() {
        lane.sort_by_key(|r| r.start_ns);
    }
    let h = History::open(&dir.join(analysis::STATE_HISTORY)).expect("the state history");
    let text = |id: u32| (id != NO_STRING).then(|| h.string(id).expect("a string").to_string());
    // (start, end, state, cpu, waker, syscall, detail) of a row and a record.
    type Fields = (
        i64,
        i64,
        String,
        Option<i32>,
        Option<i32>,
        Option<String>,
        Option<String>,
    );
    let of_row = |r: &ThreadStateRow| -> Fields {
        (
            r.start_ns,
            r.end_ns,
            r.state.clone(),
            r.cpu,
            r.waker_tid,
            r.syscall.clone(),
            r.detail.clone(),
        )
    };
    let of_record = |r: &deepspan_store::history::Record| -> Fields {
        (
            r.start,
            r.end,
            text(r.state).unwrap(),
            (r.cpu >= 0).then_some(r.cpu),
            (r.tid >= 0).then_some(r.tid),
            text(r.syscall),
            text(r.detail),
        )
    };
    let (t0, t1) = rows
        .values()
        .flatten()
        .fold((i64::MAX, i64::MIN), |(a, b), r| {
            (a.min(r.start_ns), b.max(r.end_ns))
        });
    let threads = h
        .lanes()
        .iter()
        .filter(|l| matches!(l.key, LaneKey::Thread(_)));
    assert_eq!(threads.count(), rows.len(), "a lane per thread");
    let mut asked = 0;
    let mut summaries = 0;
    for (&tid, lane) in &rows {
        let key = LaneKey::Thread(tid);
        let meta = h.lane(key).expect("the thread's lane");
        assert_eq!(meta.records as usize, lane.len());
        assert_eq!(
            (meta.pid, meta.comm.as_deref()),
            (lane[0].pid, lane[0].comm.as_deref())
        );
        let (first, all, more) = h.window(key, i64::MIN, i64::MAX, usize::MAX).unwrap();
        assert_eq!((first, more), (0, false));
        let expected: Vec<Fields> = lane.iter().map(of_row).collect();
        let got: Vec<Fields> = all.iter().map(of_record).collect();
        assert_eq!(got, expected, "thread {tid}'s lane");
        // The state at each start, inside, at each end and in gaps.
        for r in lane {
            for t in [
                r.start_ns,
                (r.start_ns + r.end_ns) / 2,
                r.end_ns - 1,
                r.end_ns,
            ] {
                let scan = lane.iter().position(|x| x.start_ns <= t && t < x.end_ns);
                let got = h.state_at(key, t).unwrap();
                assert_eq!(got.map(|(i, _)| i as usize), scan, "thread {tid} at {t}");
                if let (Some((_, rec)), Some(i)) = (got, scan) {
                    assert_eq!(of_record(&rec), of_row(&lane[i]));
                }
                asked += 1;
            }
        }
        // Windows of the run cut in 37 steps.
        let step = ((t1 - t0) / 37).max(1);
        for k in 0..37 {
            let (from, to) = (t0 + k * step, t0 + (k + 2) * step);
            let scan: Vec<Fields> = lane
                .iter()
                .filter(|x| x.start_ns < to && x.end_ns > from)
                .map(of_row)
                .collect();
            let (_, got, _) = h.window(key, from, to, usize::MAX).unwrap();
            assert_eq!(
                got.iter().map(of_record).collect::<Vec<_>>(),
                scan,
                "thread {tid} in [{from}, {to})"
            );
            asked += 1;
        }
        // Zoomed out: each summary stands for the rows it spans, with their
        // dominant state; the rest come as rows.
        for pixels in [100, 2_000] {
            let resolution = ((t1 - t0) / pixels).max(1);
            let (coarse, more) = h
                .coarse_window(key, t0, t1 + 1, resolution, usize::MAX)
                .unwrap();
            assert!(!more);
            let mut next = 0;
            for c in &coarse {
                let rows = &lane[next..next + c.records as usize];
                next += rows.len();
                if c.records == 1 {
                    assert_eq!(of_record(&c.record), of_row(&rows[0]), "thread {tid}");
                    continue;
                }
                summaries += 1;
                assert_eq!(
                    (c.record.start, c.record.end),
                    (rows[0].start_ns, rows[rows.len() - 1].end_ns)
                );
                assert!(c.record.end - c.record.start < resolution);
                let mut by_state: Vec<(&str, i64)> = Vec::new();
                for r in rows {
                    match by_state.iter_mut().find(|(s, _)| *s == r.state) {
                        Some(s) => s.1 += r.end_ns - r.start_ns,
                        None => by_state.push((&r.state, r.end_ns - r.start_ns)),
                    }
                }
                let most = by_state.iter().map(|s| s.1).max().unwrap();
                let first_most = by_state.iter().find(|s| s.1 == most).unwrap();
                assert_eq!(
                    (text(c.record.state).unwrap().as_str(), c.category_ns),
                    *first_most,
                    "thread {tid}'s block at {}",
                    c.record.start
                );
                assert_eq!(c.covered_ns, by_state.iter().map(|s| s.1).sum::<i64>());
            }
            assert_eq!(next, lane.len(), "thread {tid}: every row stood for once");
            asked += 1;
        }
    }
    assert!(summaries > 0, "no block was summarised");
    // Each CPU's running threads.
    let mut running: BTreeMap<i32, Vec<(i64, i64, i32)>> = BTreeMap::new();
    for r in rows.values().flatten().filter(|r| r.state == "RUNNING") {
        if let Some(cpu) = r.cpu {
            running
                .entry(cpu)
                .or_default()
                .push((r.start_ns, r.end_ns, r.tid));
        }
    }
    assert!(!running.is_empty(), "the trace's threads ran");
    for (&cpu, slices) in &mut running {
        slices.sort();
        let (_, got, _) = h
            .window(LaneKey::Cpu(cpu), i64::MIN, i64::MAX, usize::MAX)
            .unwrap();
        let got: Vec<(i64, i64, i32)> = got.iter().map(|r| (r.start, r.end, r.tid)).collect();
        assert_eq!(&got, slices, "CPU {cpu}");
        asked += 1;
    }
    assert!(asked > 1000, "only {asked} questions");
}
