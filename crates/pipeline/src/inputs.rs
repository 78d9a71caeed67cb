//! The run's inputs as the analysis takes them: spans (deduplicated, with
//! their parent index, times on the kernel clock and SDK thread), what
//! placement reads of them, the recorder's process scan and saved tgids,
//! and the span active on each thread.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use deepspan_analysis::{
    ActivationInput, PlacementSpan, ScannedProcess, SpanIdx, SpanInput, ThreadWork, WorkInterval,
};
use deepspan_model::Tid;
use deepspan_spans::activity::ActivityOptions;
use deepspan_spans::clock::span_mono_exact;
use deepspan_spans::model::{Resource, Value};
use deepspan_spans::{ClockMap, Span, SpanKind, SpanRef, ThreadActivity};
use deepspan_store::SpanMeta;
use rustc_hash::{FxHashMap, FxHashSet};

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
        // Set once the span is placed (`stages::set_arrivals`).
        arrival: None,
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
    let port = [
        "network.local.port",
        "server.port",
        "net.host.port",
        "host.port",
    ]
    .iter()
    .find_map(|k| int(k))
    .and_then(|p| u16::try_from(p).ok())
    .or_else(|| {
        ["url.full", "http.url", "http.host", "server.address"]
            .iter()
            .find_map(|k| attr(k).and_then(|v| v.as_str()).and_then(port_of))
    });
    let client_port = ["client.port", "net.peer.port", "network.peer.port"]
        .iter()
        .find_map(|k| int(k))
        .and_then(|p| u16::try_from(p).ok());
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
        client_port,
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

/// What the recorder's /proc scans say (`RUN/processes.json`).
#[derive(Default)]
pub(crate) struct ProcessScan {
    pub processes: Vec<ScannedProcess>,
    /// (PID namespace, thread id in it) → host thread id, for the threads
    /// of processes in PID namespaces of their own.
    pub host_tids: FxHashMap<(u64, u32), u32>,
    /// The ids those processes have in their namespaces: what a stock
    /// SDK's `process.pid` says from inside a container.
    pub namespaced_pids: FxHashSet<u32>,
}

/// The recorder's /proc scan (`RUN/processes.json`), when the run has one.
pub(crate) fn read_process_scan(run: &Path, notes: &mut Vec<String>) -> ProcessScan {
    let path = deepspan_run::Run::new(run).processes();
    let Ok(text) = std::fs::read(&path) else {
        return ProcessScan::default();
    };
    match serde_json::from_slice::<Vec<deepspan_record::ProcessEntry>>(&text) {
        Ok(list) => {
            let namespaced = || list.iter().filter_map(|p| Some((p, p.pid_ns?)));
            let host_tids = namespaced()
                .flat_map(|(p, ns)| {
                    let tids = p.namespaced_tids.iter();
                    tids.map(move |(&id, &host)| ((ns, id), host))
                })
                .collect();
            let namespaced_pids = namespaced()
                .flat_map(|(p, _)| {
                    let tids = p.namespaced_tids.iter();
                    tids.filter(|(_, &host)| host as Tid == p.pid)
                        .map(|(&id, _)| id)
                })
                .collect();
            let processes = list
                .into_iter()
                .map(|p| ScannedProcess {
                    pid: p.pid,
                    comm: p.comm,
                    cmdline: p.cmdline,
                    listening_ports: p.listening_ports,
                    container: p.container.map(Into::into),
                })
                .collect();
            ProcessScan {
                processes,
                host_tids,
                namespaced_pids,
            }
        }
        Err(e) => {
            notes.push(format!(
                "{}: {e}; the process scan is not used",
                path.display()
            ));
            ProcessScan::default()
        }
    }
}

/// Puts the ids of spans from processes in PID namespaces of their own (a
/// container's) into the host's, which the kernel trace uses, through the
/// scan's ids of each thread in both:
/// - the SDK's thread ids (`deepspan.pid_ns` says their namespace). A
///   thread the scans never saw (one that started and ended between two
///   of them) loses its id: its spans are then placed from the kernel
///   trace, as spans without the SDK are, and never on the host's thread
///   of the same number;
/// - the resource's `process.pid`, likewise. A stock SDK's, which says no
///   namespace, is dropped when a process in a container has that id
///   there: it may be that one's, not the host's process of that number.
pub(crate) fn to_host_tids(spans: &mut [Span], scan: &ProcessScan, notes: &mut Vec<String>) {
    let (mut namespaced, mut unknown, mut ambiguous) = (0usize, 0usize, 0usize);
    // Old resource (kept alive, so that its address names it) → new.
    let mut resources: FxHashMap<*const Resource, (Arc<Resource>, Arc<Resource>)> =
        FxHashMap::default();
    for s in spans.iter_mut() {
        // On a host without containers of their own PID namespace (no
        // span says one, the scan knows none) nothing changes: no lookup.
        if s.sync.pid_ns.is_none() && scan.namespaced_pids.is_empty() {
            continue;
        }
        let pid = s.resource.attributes.get("process.pid");
        let pid = pid
            .and_then(|v| v.as_i64())
            .and_then(|p| u32::try_from(p).ok());
        if let Some(pid) = pid {
            let host = match s.sync.pid_ns {
                Some(ns) => scan.host_tids.get(&(ns, pid)).copied(),
                None if scan.namespaced_pids.contains(&pid) => {
                    ambiguous += 1;
                    None
                }
                None => Some(pid),
            };
            if host != Some(pid) {
                let old = Arc::clone(&s.resource);
                let (_, new) = resources.entry(Arc::as_ptr(&old)).or_insert_with(|| {
                    let mut r = (*old).clone();
                    match host {
                        Some(h) => r.attributes.insert("process.pid", Value::Int(h.into())),
                        None => drop(r.attributes.remove("process.pid")),
                    }
                    (old, Arc::new(r))
                });
                s.resource = Arc::clone(new);
            }
        }
        if s.sync.pid_ns.is_some() {
            namespaced += 1;
            let host_tid = |ns, tid| scan.host_tids.get(&(ns, tid)).copied();
            unknown += usize::from(s.sync.to_host_tids(host_tid) > 0);
        }
    }
    if unknown > 0 {
        notes.push(format!(
            "{unknown} of {namespaced} span(s) from processes in PID namespaces of their own \
             (containers) ran on threads the recorder's /proc scans did not see, so their \
             thread ids in the kernel trace are unknown: placed from the kernel trace instead"
        ));
    }
    if ambiguous > 0 {
        notes.push(format!(
            "{ambiguous} span(s) without deepspan's SDK give a process.pid that a process in a \
             container also has in its PID namespace: not used to place them"
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use deepspan_spans::model::{Attributes, ATTR_PID_NS, ATTR_TID};
    use deepspan_spans::{SpanId, TraceId};

    fn resource(process_pid: i64) -> Arc<Resource> {
        Arc::new(Resource::new(Attributes(vec![
            ("service.name".into(), Value::String("pricing".into())),
            ("process.pid".into(), Value::Int(process_pid)),
        ])))
    }

    fn span(id: u64, resource: &Arc<Resource>, sdk: Option<(u64, i64)>) -> Span {
        let mut s = Span::new(TraceId(1), SpanId(id), None, "GET /price", 0, 10);
        s.resource = Arc::clone(resource);
        if let Some((ns, tid)) = sdk {
            s.attributes = Attributes(vec![
                (ATTR_TID.into(), Value::Int(tid)),
                (ATTR_PID_NS.into(), Value::Int(ns as i64)),
            ]);
        }
        s.refresh_sync();
        s
    }

    #[test]
    fn ids_from_inside_a_container_become_the_hosts_or_none() {
        let ns = 4_026_532_999;
        // pricing: pid 1 in its namespace, 955 on the host; thread 7 is 1273.
        let scan = ProcessScan {
            processes: Vec::new(),
            host_tids: [((ns, 1), 955), ((ns, 7), 1273)].into_iter().collect(),
            namespaced_pids: [1].into_iter().collect(),
        };
        let in_container = resource(1);
        let mut spans = vec![
            span(1, &in_container, Some((ns, 7))),
            span(2, &in_container, Some((ns, 9))),
            span(3, &resource(1), None),
            span(4, &resource(4242), None),
        ];
        let mut notes = Vec::new();
        to_host_tids(&mut spans, &scan, &mut notes);
        let pid = |s: &Span| {
            s.resource
                .attributes
                .get("process.pid")
                .and_then(|v| v.as_i64())
        };
        let found: Vec<_> = spans.iter().map(|s| (pid(s), s.sync.tid)).collect();
        assert_eq!(
            found,
            [
                (Some(955), Some(1273)),
                // A thread no scan saw: no thread, not the host's 9.
                (Some(955), None),
                // A stock SDK's pid 1 may be the container's: not used.
                (None, None),
                (Some(4242), None),
            ]
        );
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("1 of 2 span(s)"), "{notes:?}");
        // The spans of one resource still share one.
        assert!(Arc::ptr_eq(&spans[0].resource, &spans[1].resource));
    }
}
