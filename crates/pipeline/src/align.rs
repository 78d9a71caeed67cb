//! Several hosts' inputs on one clock: every host's clock as a linear
//! transform of a reference host's, from messages matched between the
//! inputs (`deepspan sync` prints it; the multi-run analysis maps each run's
//! times through it).
//!
//! One input is one host. Messages:
//! - spans (run folders): a CLIENT span and its SERVER child on another
//!   host are two messages, client start → server start and server end →
//!   client end;
//! - TCP segments: an LTTng `net_dev_queue` or `inet_sock_local_out` (CTF
//!   folders), or a segment `record --tcp-keys` saw leave a device (runs),
//!   on one host, and a `netif_receive_skb`, `net_if_receive_skb` or
//!   `inet_sock_local_in`, or a segment seen entering a device, on another,
//!   with the same TCP (seq, ack_seq, flags), as Trace Compass's
//!   TcpEventKey;
//!
//! Times are each host's kernel trace clock: CLOCK_MONOTONIC for a run
//! recorded by deepspan (spans placed by their deepspan fields, else mapped
//! through the run's clock samples), the CTF clock's absolute time for a CTF
//! folder and for a run imported with `--ctf`.
//!
//! Each input's time range is the first and last time it holds on that
//! clock: its CTF trace's events, a recorded run's start and end, and every
//! span and segment time gathered from it. A host's bounds (the lines that
//! fit its messages, see `deepspan_sync::Bounds`) are judged over that
//! range, and a note says them for every host but the reference.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use deepspan_ctf::CtfTrace;
use deepspan_model::Value;
use deepspan_spans::clock::span_mono_exact;
use deepspan_spans::{read_run_spans, ClockMap, SpanId, SpanKind, TraceId};
use deepspan_sync::{Bounds, Estimator, HostGraph, HostSync};

use deepspan_run::{Manifest, Run};

use crate::Error;

/// Every input's clock on the reference host's.
#[derive(Clone, Debug)]
pub struct Alignment {
    /// Index into `hosts` of the reference host.
    pub reference: usize,
    /// One per input, in input order (host, transform onto the reference
    /// clock, quality, messages matched with its parent in the tree, parent,
    /// pairwise estimate).
    pub hosts: Vec<HostSync>,
    /// The inputs, in order.
    pub inputs: Vec<PathBuf>,
    /// One per input, in input order: its time range on its own clock
    /// (None when it holds no time).
    pub ranges: Vec<Option<TimeRange>>,
    /// What the user should know (counts of pairs matched by kind, inputs
    /// with nothing matched, ...).
    pub notes: Vec<String>,
    /// Each host's bounds in a sentence, or why it has none (what
    /// `deepspan sync`'s table shows in columns).
    pub bounds_notes: Vec<String>,
}

/// The first and last time an input holds, on its own clock, in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeRange {
    pub first_ns: u64,
    pub last_ns: u64,
}

/// Aligns the clocks of `inputs` (run folders and LTTng CTF folders, one
/// per host) onto the clock of the host named `reference` (default: the
/// first input's host), with the default estimator.
pub fn align_inputs(inputs: &[PathBuf], reference: Option<&str>) -> Result<Alignment, Error> {
    align_inputs_with_estimator(inputs, reference, Estimator::default())
}

/// [`align_inputs`] with the line `estimator` takes between each pair's
/// extreme lines.
pub fn align_inputs_with_estimator(
    inputs: &[PathBuf],
    reference: Option<&str>,
    estimator: Estimator,
) -> Result<Alignment, Error> {
    let mut graph = HostGraph::new();
    let mut collected = Collected::default();
    let mut notes = Vec::new();
    let mut hosts: Vec<String> = Vec::new();
    for (input, path) in inputs.iter().enumerate() {
        let host = if is_run(path) {
            read_run(path, input, &mut collected, &mut notes)?
        } else if path.is_dir() {
            read_ctf(path, input, &mut collected, &mut notes)?
        } else {
            return Err(Error::NotAnAlignInput { path: path.clone() });
        };
        if let Some(first) = hosts.iter().position(|h| *h == host) {
            return Err(Error::SameHostTwice {
                first: inputs[first].clone(),
                second: path.clone(),
                host,
            });
        }
        graph.host(&host);
        hosts.push(host);
    }
    let (span_pairs, tcp_pairs) = match_messages(&collected, &mut graph, inputs)?;
    if span_pairs > 0 || tcp_pairs > 0 {
        notes.push(format!(
            "{span_pairs} client/server span pairs and {tcp_pairs} TCP segments matched across hosts"
        ));
    }
    let reference = match reference {
        None => 0,
        Some(name) => {
            hosts
                .iter()
                .position(|h| h == name)
                .ok_or_else(|| Error::UnknownReference {
                    name: name.to_string(),
                    hosts: hosts.clone(),
                })?
        }
    };
    let solved = graph.solve(reference, estimator).map_err(Error::Solve)?;
    let ranges: Vec<Option<TimeRange>> = (0..inputs.len())
        .map(|input| collected.ranges.get(&input).copied())
        .collect();
    // The hosts the tree reached, but the reference: their inputs hold
    // their messages' times.
    let bounds_notes = solved
        .iter()
        .zip(&ranges)
        .filter_map(|(host, range)| match (&host.parent, range) {
            (Some(_), Some(range)) => Some(bounds_note(host, *range)),
            _ => None,
        })
        .collect();
    Ok(Alignment {
        reference,
        hosts: solved,
        inputs: inputs.to_vec(),
        ranges,
        notes,
        bounds_notes,
    })
}

/// What a host's bounds say over its time range: the drifts that fit and
/// the largest error of a mapped time, or why there is no bound.
fn bounds_note(host: &HostSync, range: TimeRange) -> String {
    let name = &host.host;
    match &host.bounds {
        Bounds::Enclosed(envelope) => {
            let (low, high) = envelope.slopes();
            let error = envelope.max_error_ns(&host.transform, range.first_ns, range.last_ns);
            format!(
                "host {name}: every clock that fits the messages drifts {:+.3} to {:+.3} ppm \
                 from the reference's; a mapped time of {}..{} ns is off by at most {error:.0} ns",
                (low - 1.0) * 1e6,
                (high - 1.0) * 1e6,
                range.first_ns,
                range.last_ns
            )
        }
        Bounds::Unbounded => format!(
            "host {name}: no bound on the error of its clock's transform: on its path to the \
             reference, messages go one way only or the two ways do not interleave in time"
        ),
        Bounds::Contradicted => format!(
            "host {name}: no linear transform fits every message on its path to the reference \
             (a clock stepped, or messages were matched wrongly), so no bound on its error"
        ),
    }
}

/// A run folder, as opposed to a CTF trace folder.
fn is_run(path: &Path) -> bool {
    Run::new(path).looks_recorded()
}

/// A time on one input's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) input: usize,
    pub(crate) ns: u64,
}

/// The TCP header fields that identify a segment on both ends.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct TcpKey {
    seq: u64,
    ack_seq: u64,
    flags: u64,
}

/// Messages gathered from all inputs, matched once all are read.
#[derive(Default)]
struct Collected {
    /// CLIENT spans: (start, end) by (trace, span).
    clients: HashMap<(TraceId, SpanId), (Stamp, Stamp)>,
    /// SERVER spans with a parent: (trace, parent, start, end).
    servers: Vec<(TraceId, SpanId, Stamp, Stamp)>,
    /// TCP segments leaving a host, by key, in trace order.
    sent: HashMap<TcpKey, VecDeque<Stamp>>,
    /// TCP segments entering a host.
    received: Vec<(TcpKey, Stamp)>,
    /// Each input's time range so far, by input.
    ranges: BTreeMap<usize, TimeRange>,
}

impl Collected {
    /// Input `input` holds time `ns`.
    fn saw(&mut self, input: usize, ns: u64) {
        self.ranges
            .entry(input)
            .and_modify(|range| {
                range.first_ns = range.first_ns.min(ns);
                range.last_ns = range.last_ns.max(ns);
            })
            .or_insert(TimeRange {
                first_ns: ns,
                last_ns: ns,
            });
    }
}

/// A run folder: its host name and its CLIENT/SERVER spans.
fn read_run(
    path: &Path,
    input: usize,
    collected: &mut Collected,
    notes: &mut Vec<String>,
) -> Result<String, Error> {
    let ctf_dir = Run::new(path).ctf_dir();
    let imported_ctf = ctf_dir.is_dir();
    let ctf = if imported_ctf {
        Some(CtfTrace::open(&ctf_dir).map_err(|source| Error::OpenCtf {
            path: ctf_dir.clone(),
            source,
        })?)
    } else {
        None
    };
    let host = match (run_host(path)?, &ctf) {
        (Some(host), _) => host,
        (None, Some(trace)) => hostname_of(trace, &ctf_dir)?,
        (None, None) => {
            return Err(Error::NoHostName {
                run: path.to_path_buf(),
            })
        }
    };
    // A recorded kernel trace runs from the recording's start to its end.
    if Run::new(path).trace_dat().is_file() {
        match Manifest::load(path) {
            Ok(manifest) => {
                collected.saw(input, manifest.start.mono_ns);
                collected.saw(input, manifest.end.mono_ns);
            }
            Err(e) => notes.push(format!(
                "{e}; the run's time range is that of its spans and segments only"
            )),
        }
    }
    // The imported trace's TCP segments are on the same clock as the
    // run's spans (the CTF clock's absolute time).
    if let Some(trace) = &ctf {
        read_tcp_segments(trace, &ctf_dir, input, collected, notes)?;
    }
    // `record --tcp-keys`: on the kernel trace's clock, as the spans'
    // deepspan times.
    let recorded_keys = Run::new(path).tcp_segments();
    let has_keys = recorded_keys.is_file();
    if has_keys {
        let segments =
            deepspan_record::read_tcp_segments(&recorded_keys).map_err(|e| Error::RunManifest {
                path: recorded_keys.clone(),
                reason: e.to_string(),
            })?;
        for s in segments {
            let key = TcpKey {
                seq: s.seq.into(),
                ack_seq: s.ack_seq.into(),
                flags: s.flags.into(),
            };
            let stamp = Stamp {
                input,
                ns: s.mono_ns,
            };
            collected.saw(input, s.mono_ns);
            if s.sent {
                collected.sent.entry(key).or_default().push_back(stamp);
            } else {
                collected.received.push((key, stamp));
            }
        }
    }
    // A run imported with --ctf keeps its spans on the CTF clock, whose
    // absolute time is the wall clock span files carry.
    let clock = if imported_ctf {
        None
    } else {
        match ClockMap::from_manifest(path) {
            Ok(map) => Some(map),
            Err(e) => {
                notes.push(format!(
                    "{}: no clock mapping ({e}); spans without deepspan times are left out",
                    path.display()
                ));
                None
            }
        }
    };
    let spans_error = |source| Error::Spans {
        run: path.to_path_buf(),
        source,
    };
    let (mut spans, mut unplaced) = (0u64, 0u64);
    for span in read_run_spans(path).map_err(spans_error)? {
        let span = span.map_err(spans_error)?;
        spans += 1;
        if !matches!(span.kind, SpanKind::Client | SpanKind::Server) {
            continue;
        }
        let times = span_mono_exact(&span)
            .map(|t| (t.start_ns, t.end_ns))
            .or_else(|| {
                clock.as_ref().map(|c| {
                    let t = c.span_mono(&span);
                    (t.start_ns, t.end_ns)
                })
            })
            .or_else(|| imported_ctf.then_some((span.start_ns, span.end_ns)));
        let Some((start, end)) = times else {
            unplaced += 1;
            continue;
        };
        collected.saw(input, start);
        collected.saw(input, end);
        let (start, end) = (Stamp { input, ns: start }, Stamp { input, ns: end });
        match (span.kind, span.parent_span_id) {
            (SpanKind::Client, _) => {
                collected
                    .clients
                    .insert((span.trace_id, span.span_id), (start, end));
            }
            (SpanKind::Server, Some(parent)) => {
                collected.servers.push((span.trace_id, parent, start, end))
            }
            _ => {}
        }
    }
    if unplaced > 0 {
        notes.push(format!(
            "{}: {unplaced} client/server spans have no time on the run's clock and are left out",
            path.display()
        ));
    }
    if spans == 0 && !imported_ctf && !has_keys {
        let ftrace = Run::new(path).trace_dat().is_file();
        notes.push(format!(
            "{}: no spans, so nothing to match{}",
            path.display(),
            if ftrace {
                "; its kernel trace is ftrace, and the upstream net/tcp tracepoints carry no TCP \
                 sequence numbers, so packets cannot be matched across hosts either: record with \
                 `deepspan record --tcp-keys`, whose eBPF program reads the TCP header (seq, \
                 ack_seq, flags) of every segment"
            } else {
                ""
            }
        ));
    }
    Ok(host)
}

/// The manifest's `host`, read on its own so that the minimal manifest of
/// a spans-only run will do.
fn run_host(path: &Path) -> Result<Option<String>, Error> {
    let run = Run::new(path);
    if !run.manifest().is_file() {
        return Ok(None);
    }
    Manifest::load_host(path).map_err(|e| Error::RunManifest {
        path: run.manifest(),
        reason: match e {
            deepspan_run::ManifestError::Read { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// The `hostname` of a CTF folder's traces (the kernel trace's first).
fn hostname_of(trace: &CtfTrace, path: &Path) -> Result<String, Error> {
    let mut traces: Vec<_> = trace.traces().iter().collect();
    traces.sort_by_key(|t| !t.is_kernel());
    traces
        .iter()
        .find_map(|t| t.hostname().filter(|h| !h.is_empty()))
        .map(str::to_string)
        .ok_or_else(|| Error::NoCtfHostname {
            path: path.to_path_buf(),
        })
}

const TCP_SEND_EVENTS: [&str; 2] = ["net_dev_queue", "inet_sock_local_out"];
const TCP_RECEIVE_EVENTS: [&str; 3] = [
    "netif_receive_skb",
    "net_if_receive_skb",
    "inet_sock_local_in",
];

/// A CTF folder: its host name and its TCP segments.
fn read_ctf(
    path: &Path,
    input: usize,
    collected: &mut Collected,
    notes: &mut Vec<String>,
) -> Result<String, Error> {
    let trace = CtfTrace::open(path).map_err(|source| Error::NotARunNorCtf {
        path: path.to_path_buf(),
        source,
    })?;
    let host = hostname_of(&trace, path)?;
    read_tcp_segments(&trace, path, input, collected, notes)?;
    Ok(host)
}

/// The TCP segment events of a CTF trace, keyed.
fn read_tcp_segments(
    trace: &CtfTrace,
    path: &Path,
    input: usize,
    collected: &mut Collected,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let (mut packets, mut keyed) = (0u64, 0u64);
    for event in trace.events() {
        let event = event.map_err(|source| Error::DecodeCtf {
            path: path.to_path_buf(),
            source,
        })?;
        collected.saw(input, event.ts());
        let name = event.name();
        let sending = TCP_SEND_EVENTS.contains(&name);
        if !sending && !TCP_RECEIVE_EVENTS.contains(&name) {
            continue;
        }
        packets += 1;
        let Some(key) = tcp_key(event.fields()) else {
            continue;
        };
        keyed += 1;
        let stamp = Stamp {
            input,
            ns: event.ts(),
        };
        if sending {
            collected.sent.entry(key).or_default().push_back(stamp);
        } else {
            collected.received.push((key, stamp));
        }
    }
    if packets > 0 && keyed == 0 {
        notes.push(format!(
            "{}: {packets} packet events, none with TCP header fields (seq, ack_seq, flags): \
             the lttng-modules versions whose net_dev_queue / netif_receive_skb carry the \
             network header record them",
            path.display()
        ));
    } else if packets == 0 {
        notes.push(format!(
            "{}: no packet events ({} or {}), so nothing to match",
            path.display(),
            TCP_SEND_EVENTS.join(", "),
            TCP_RECEIVE_EVENTS.join(", ")
        ));
    }
    Ok(())
}

/// (seq, ack_seq, flags) of a TCP segment event: fields of those names at
/// the top level (`inet_sock_local_*`) or nested in the network header
/// (`net_dev_queue`'s `network_header.…transport_header.…seq`).
fn tcp_key(fields: &[(std::sync::Arc<str>, Value)]) -> Option<TcpKey> {
    let find = |wanted: &str| {
        fields.iter().find_map(|(name, value)| {
            if name.rsplit('.').next() != Some(wanted) {
                return None;
            }
            match *value {
                Value::UInt(v) => Some(v),
                Value::Int(v) => u64::try_from(v).ok(),
                _ => None,
            }
        })
    };
    Some(TcpKey {
        seq: find("seq")?,
        ack_seq: find("ack_seq")?,
        flags: find("flags")?,
    })
}

/// Adds a message from `from` to `to` to the graph; `what` names it in the
/// error.
pub(crate) fn add_message(
    graph: &mut HostGraph,
    inputs: &[PathBuf],
    from: Stamp,
    to: Stamp,
    what: &dyn Fn() -> String,
) -> Result<(), Error> {
    graph
        .add_message(from.input, from.ns, to.input, to.ns)
        .map_err(|source| Error::Message {
            what: what(),
            from: inputs[from.input].clone(),
            to: inputs[to.input].clone(),
            source,
        })
}

/// Adds the matched messages to the graph; returns the span pairs and TCP
/// segments matched.
///
/// Segments come first: where two hosts exchanged matched segments, their
/// span pairs are left out. A segment's ends are microseconds apart, while
/// a span pair's can even cross: a server span commonly ends after the
/// reply has left, and the client may have read it by then (a message
/// "received before it was sent", which breaks the hulls apart).
fn match_messages(
    collected: &Collected,
    graph: &mut HostGraph,
    inputs: &[PathBuf],
) -> Result<(u64, u64), Error> {
    let pair = |a: usize, b: usize| (a.min(b), a.max(b));
    let mut sent = collected.sent.clone();
    let mut tcp = 0;
    let mut by_segments = std::collections::HashSet::new();
    for (key, receive) in &collected.received {
        let Some(queue) = sent.get_mut(key) else {
            continue;
        };
        // The first segment with this key that another host sent.
        let Some(i) = queue.iter().position(|s| s.input != receive.input) else {
            continue;
        };
        let send = queue.remove(i).expect("position is in the queue");
        let what = || {
            format!(
                "TCP segment seq {} ack {} flags {:#x}",
                key.seq, key.ack_seq, key.flags
            )
        };
        add_message(graph, inputs, send, *receive, &what)?;
        by_segments.insert(pair(send.input, receive.input));
        tcp += 1;
    }
    let mut span_pairs = 0;
    for (trace, parent, server_start, server_end) in &collected.servers {
        let Some(&(client_start, client_end)) = collected.clients.get(&(*trace, *parent)) else {
            continue;
        };
        if client_start.input == server_start.input
            || by_segments.contains(&pair(client_start.input, server_start.input))
        {
            continue;
        }
        let what = || format!("client span {parent} of trace {trace} and its server child");
        add_message(graph, inputs, client_start, *server_start, &what)?;
        add_message(graph, inputs, *server_end, client_end, &what)?;
        span_pairs += 1;
    }
    Ok((span_pairs, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn field(name: &str, value: Value) -> (Arc<str>, Value) {
        (Arc::from(name), value)
    }

    #[test]
    fn tcp_key_is_found_nested_or_at_the_top() {
        // net_dev_queue with the network header, flattened by the CTF reader.
        let nested = vec![
            field("skbaddr", Value::UInt(0xffff_8800)),
            field("network_header.ipv4.protocol", Value::UInt(6)),
            field(
                "network_header.ipv4.transport_header.tcp.seq",
                Value::UInt(1001),
            ),
            field(
                "network_header.ipv4.transport_header.tcp.ack_seq",
                Value::UInt(77),
            ),
            field(
                "network_header.ipv4.transport_header.tcp.flags",
                Value::UInt(0x18),
            ),
        ];
        assert_eq!(
            tcp_key(&nested),
            Some(TcpKey {
                seq: 1001,
                ack_seq: 77,
                flags: 0x18
            })
        );
        let top = vec![
            field("seq", Value::Int(5)),
            field("ack_seq", Value::Int(6)),
            field("flags", Value::Int(2)),
        ];
        assert_eq!(
            tcp_key(&top),
            Some(TcpKey {
                seq: 5,
                ack_seq: 6,
                flags: 2
            })
        );
        // An older net_dev_queue: no header, no key; "subseq" is not "seq".
        let none = vec![
            field("skbaddr", Value::UInt(1)),
            field("subseq", Value::UInt(1)),
            field("ack_seq", Value::UInt(1)),
            field("flags", Value::UInt(1)),
        ];
        assert_eq!(tcp_key(&none), None);
        assert_eq!(tcp_key(&top[..2]), None);
    }

    #[test]
    fn segments_match_the_first_send_of_another_host() {
        let key = TcpKey {
            seq: 1,
            ack_seq: 2,
            flags: 0x10,
        };
        let other = TcpKey { seq: 9, ..key };
        let at = |input, ns| Stamp { input, ns };
        let mut collected = Collected::default();
        // Host 1 sends it twice (a retransmission), host 0 receives it
        // twice and also sees its own copy of a segment host 0 sent.
        collected
            .sent
            .insert(key, VecDeque::from([at(1, 100), at(1, 300)]));
        collected.sent.insert(other, VecDeque::from([at(0, 50)]));
        collected.received = vec![
            (key, at(0, 1_000_150)),
            (key, at(0, 1_000_350)),
            (other, at(0, 60)),
        ];
        let mut graph = HostGraph::new();
        graph.host("zero");
        graph.host("one");
        let inputs = [PathBuf::from("zero"), PathBuf::from("one")];
        let (spans, tcp) = match_messages(&collected, &mut graph, &inputs).unwrap();
        assert_eq!((spans, tcp), (0, 2));
        let estimate = graph.pair_estimate(0, 1, Estimator::MostRoom).unwrap();
        assert_eq!(estimate.matched, 2);
        assert_eq!(estimate.quality, deepspan_sync::Quality::Incomplete);
        // One way only, 1 ms (+ 50 ns) later on host zero's clock.
        assert_eq!(estimate.transform.map_ns(200), 1_000_250);
    }

    #[test]
    fn segments_between_two_hosts_leave_their_span_pairs_out() {
        let at = |input, ns| Stamp { input, ns };
        let key = |seq| TcpKey {
            seq,
            ack_seq: 1,
            flags: 0x18,
        };
        let mut collected = Collected::default();
        // Two segments each way, 1 µs in flight on one clock.
        for (seq, from, ns) in [(1, 0, 1_000), (2, 1, 5_000), (3, 0, 10_000), (4, 1, 15_000)] {
            collected
                .sent
                .insert(key(seq), VecDeque::from([at(from, ns)]));
            collected
                .received
                .push((key(seq), at(1 - from, ns + 1_000)));
        }
        // A span pair whose server ends after its client: left out, else
        // the hulls would cross.
        let (trace, client) = (TraceId(7), SpanId(3));
        collected
            .clients
            .insert((trace, client), (at(0, 1_500), at(0, 5_500)));
        collected
            .servers
            .push((trace, client, at(1, 1_800), at(1, 5_900)));
        let mut graph = HostGraph::new();
        graph.host("zero");
        graph.host("one");
        let inputs = [PathBuf::from("zero"), PathBuf::from("one")];
        assert_eq!(
            match_messages(&collected, &mut graph, &inputs).unwrap(),
            (0, 4)
        );
        let estimate = graph.pair_estimate(0, 1, Estimator::MostRoom).unwrap();
        assert_eq!(estimate.matched, 4);
        assert_eq!(estimate.quality, deepspan_sync::Quality::Accurate);
    }

    #[test]
    fn notes_give_each_hosts_bounds_or_why_it_has_none() {
        let mut graph = HostGraph::new();
        let [zero, one, two, three] = ["zero", "one", "two", "three"].map(|h| graph.host(h));
        // one: segments both ways, interleaved, 1 µs in flight.
        for (from, to, ns) in [
            (zero, one, 1_000),
            (one, zero, 5_000),
            (zero, one, 10_000),
            (one, zero, 15_000),
        ] {
            graph.add_message(from, ns, to, ns + 1_000).unwrap();
        }
        // two: one way only.
        graph.add_message(two, 3_000, zero, 4_000).unwrap();
        // three: a segment received 200 ns before it was sent, whatever
        // the clocks are, between two that bracket it.
        graph.add_message(zero, 1_000, three, 1_100).unwrap();
        graph.add_message(three, 2_000, zero, 1_800).unwrap();
        graph.add_message(zero, 3_000, three, 3_100).unwrap();
        let hosts = graph.solve(zero, Estimator::MostRoom).unwrap();
        let range = TimeRange {
            first_ns: 0,
            last_ns: 20_000,
        };
        let note = bounds_note(&hosts[one], range);
        assert!(
            note.starts_with("host one: every clock that fits the messages drifts")
                && note.contains("a mapped time of 0..20000 ns is off by at most"),
            "{note}"
        );
        let note = bounds_note(&hosts[two], range);
        assert!(
            note.contains("no bound") && note.contains("one way only"),
            "{note}"
        );
        let note = bounds_note(&hosts[three], range);
        assert!(note.contains("no linear transform fits"), "{note}");
    }

    #[test]
    fn an_input_that_is_no_folder_is_named() {
        let missing = PathBuf::from("/nonexistent/deepspan-align-input");
        let err = align_inputs(std::slice::from_ref(&missing), None).unwrap_err();
        assert!(matches!(err, Error::NotAnAlignInput { .. }), "{err}");
        assert!(err.to_string().contains("deepspan-align-input"), "{err}");
    }
}
