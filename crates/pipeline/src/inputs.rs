//! The run's inputs as the analysis takes them: spans (deduplicated, with
//! their parent index, times on the kernel clock and SDK thread), what
//! placement reads of them, the recorder's process scan and saved tgids,
//! and the span active on each thread.

use std::collections::HashMap;
use std::path::Path;

use deepspan_analysis::{
    ActivationInput, PlacementSpan, ScannedProcess, SpanIdx, SpanInput, ThreadWork, WorkInterval,
};
use deepspan_model::Tid;
use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::clock::span_mono_exact;
use deepspan_spans::{ClockMap, Span, SpanKind, SpanRef, ThreadActivity};
use deepspan_store::SpanMeta;
use rustc_hash::FxHashMap;

use crate::Error;

/// The run's spans, each (trace id, span id) once; duplicates and what the
/// reader skipped become notes.
pub(crate) fn read_spans(run: &Path, notes: &mut Vec<String>) -> Result<Vec<Span>, Error> {
    let spans_error = |source| Error::Spans {
        run: run.to_path_buf(),
        source,
    };
    let mut reader = deepspan_spans::read_run_spans(run).map_err(spans_error)?;
    let mut spans = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut duplicates = 0usize;
    for s in reader.by_ref() {
        let s = s.map_err(spans_error)?;
        if seen.insert(SpanRef::of(&s)) {
            spans.push(s);
        } else {
            duplicates += 1;
        }
    }
    if duplicates > 0 {
        notes.push(format!(
            "{duplicates} duplicate span(s) (same trace and span id) ignored"
        ));
    }
    notes.append(&mut reader.warnings);
    Ok(spans)
}

/// What the request analysis reads of a span.
pub(crate) fn span_input(
    s: &Span,
    index: &HashMap<SpanRef, SpanIdx>,
    clock: Option<&ClockMap>,
    opts: ActivityOptions,
) -> SpanInput {
    let parent = s.parent_span_id.and_then(|p| {
        index
            .get(&SpanRef {
                trace_id: s.trace_id,
                span_id: p,
            })
            .copied()
    });
    let exact = span_mono_exact(s);
    let mapped = exact.or_else(|| clock.map(|c| c.span_mono(s)));
    let holder = s.sync.tid.and_then(|t| Tid::try_from(t).ok()).or_else(|| {
        opts.thread_id_is_os_tid
            .then(|| s.attributes.get("thread.id").and_then(|v| v.as_i64()))
            .flatten()
            .and_then(|t| Tid::try_from(t).ok())
    });
    SpanInput {
        parent,
        entry: matches!(s.kind, SpanKind::Server | SpanKind::Consumer),
        times: mapped.map(|m| (m.start_ns, m.end_ns)),
        exact_times: exact.is_some(),
        holder,
        activations: s
            .sync
            .activations
            .iter()
            .filter_map(|a| {
                Some(ActivationInput {
                    tid: Tid::try_from(a.tid).ok()?,
                    ts: a.mono_ns,
                    on: a.on,
                })
            })
            .collect(),
        inferred: None,
    }
}

/// What placement reads of a span: its resource and attributes.
pub(crate) fn placement_span(s: &Span, input: &SpanInput) -> PlacementSpan {
    let attr = |k: &str| s.attributes.get(k).or_else(|| s.resource.attributes.get(k));
    let int = |k: &str| {
        attr(k).and_then(|v| {
            v.as_i64()
                .or_else(|| v.as_str().and_then(|t| t.parse().ok()))
        })
    };
    let port = ["server.port", "net.host.port", "host.port"]
        .iter()
        .find_map(|k| int(k))
        .and_then(|p| u16::try_from(p).ok())
        .or_else(|| {
            ["url.full", "http.url", "http.host", "server.address"]
                .iter()
                .find_map(|k| attr(k).and_then(|v| v.as_str()).and_then(port_of))
        });
    PlacementSpan {
        parent: input.parent,
        entry: input.entry,
        times: input.times,
        sdk_placed: input.holder.is_some() || !input.activations.is_empty(),
        pid: int("process.pid").and_then(|p| Tid::try_from(p).ok()),
        service: s.service_name().to_string(),
        thread_name: attr("thread.name")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        port,
        sdk_language: s
            .resource
            .attributes
            .get("telemetry.sdk.language")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    }
}

/// The port of `scheme://host:port/…` or `host:port`, if it says one.
fn port_of(text: &str) -> Option<u16> {
    let rest = text.split_once("://").map_or(text, |x| x.1);
    let authority = rest.split(['/', '?', '#']).next()?;
    let (_, port) = authority.rsplit_once(':')?;
    port.parse().ok()
}

/// The recorder's /proc scan (`RUN/processes.json`), when the run has one.
pub(crate) fn read_process_scan(run: &Path, notes: &mut Vec<String>) -> Vec<ScannedProcess> {
    let path = deepspan_run::Run::new(run).processes();
    let Ok(text) = std::fs::read(&path) else {
        return Vec::new();
    };
    match serde_json::from_slice::<Vec<deepspan_record::ProcessEntry>>(&text) {
        Ok(list) => list
            .into_iter()
            .map(|p| ScannedProcess {
                pid: p.pid,
                comm: p.comm,
                cmdline: p.cmdline,
                listening_ports: p.listening_ports,
                container: p.container.map(Into::into),
            })
            .collect(),
        Err(e) => {
            notes.push(format!(
                "{}: {e}; the process scan is not used",
                path.display()
            ));
            Vec::new()
        }
    }
}

/// What the tables keep of a span.
pub(crate) fn span_meta(s: &Span) -> SpanMeta {
    SpanMeta {
        trace_id: s.trace_id.0,
        span_id: s.span_id.0,
        parent_span_id: s.parent_span_id.map(|p| p.0),
        service: s.service_name().to_string(),
        operation: s.name.clone(),
        kind: match s.kind {
            SpanKind::Unspecified => "unspecified",
            SpanKind::Internal => "internal",
            SpanKind::Server => "server",
            SpanKind::Client => "client",
            SpanKind::Producer => "producer",
            SpanKind::Consumer => "consumer",
        },
    }
}

/// The span active on each thread, as span indices, read once from the
/// activity index (queries then cost a binary search, no hashing).
pub(crate) struct Work {
    by_tid: FxHashMap<Tid, Vec<WorkInterval>>,
}

impl Work {
    pub(crate) fn new(activity: &ThreadActivity, index: &HashMap<SpanRef, SpanIdx>) -> Work {
        let by_tid = activity
            .threads()
            .into_iter()
            .filter_map(|t| {
                let intervals: Vec<WorkInterval> = activity
                    .active_during(t, 0, u64::MAX)
                    .into_iter()
                    .filter_map(|(a, b, r)| {
                        Some(WorkInterval {
                            start: a,
                            end: b,
                            span: *index.get(&r)?,
                        })
                    })
                    .collect();
                Some((Tid::try_from(t).ok()?, intervals))
            })
            .collect();
        Work { by_tid }
    }
}

impl ThreadWork for Work {
    fn work_during(&self, tid: Tid, start: u64, end: u64, out: &mut Vec<WorkInterval>) {
        let Some(v) = self.by_tid.get(&tid) else {
            return;
        };
        let first = v.partition_point(|x| x.end <= start);
        for w in v[first..].iter().take_while(|x| x.start < end) {
            out.push(WorkInterval {
                start: w.start.max(start),
                end: w.end.min(end),
                span: w.span,
            });
        }
    }
}

/// `RUN/kernel/saved_tgids` (`tid tgid` lines), when the recorder saved it.
pub(crate) fn read_tgids(run: &Path) -> HashMap<Tid, Tid> {
    let Ok(text) = std::fs::read_to_string(deepspan_run::Run::new(run).saved_tgids()) else {
        return HashMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect()
}
