//! Placement of spans that carry no deepspan fields (`sync: inferred` and
//! `sync: process`): which process, then which thread, served each request,
//! found from the kernel trace alone.
//!
//! A stock OpenTelemetry SDK gives a span wall-clock times, a resource
//! (`service.name`, sometimes `process.pid`) and attributes (`thread.name`,
//! the server port), but no OS thread. The kernel trace says what every
//! thread did; the span's times, mapped to the kernel clock, say when the
//! request started and ended. So:
//!
//! 1. **Process**: the resource's `process.pid`; else the processes whose
//!    name (comm, 15 bytes) or command line names the service; else the
//!    process listening on the span's server port (from the recording's
//!    /proc scan), or whose threads received and sent on connections of
//!    that port (the socket-call capture: a server that listened between
//!    two scans); else the process where most of the service's requests
//!    fit best (a majority vote over every process's threads).
//! 2. **Thread**: of that process's threads, the one that was running at
//!    the span's start and at its end, whose socket receive (its own, or the
//!    one of the thread that woke it: an acceptor or event loop handing the
//!    request to a pool thread through a queue: the wake-up edge) returned
//!    just before the start, and whose send went out nearest the end. Each
//!    of the four is a distance in nanoseconds (the run distances weigh
//!    [`RUN_WEIGHT`] times more: a span's times are taken while its thread
//!    runs; the I/O distances leave out time the thread waited for a CPU,
//!    which delays a request on its own thread under a quota or load); the
//!    thread with the smallest sum wins. When the span names its client's
//!    port (`client.port`, `net.peer.port`) and the recording named each
//!    call's socket (the socket-call capture), only calls on the server end
//!    of that connection are the request's: time alone cannot tell two
//!    requests handed to two pool threads at once apart ([`Connection`]).
//!    A thread that hands many requests over is an acceptor and serves
//!    none; a pool thread that took a queued request without a wake-up has
//!    the acceptor's receive. A `thread.name` attribute must equal the
//!    thread's comm (cut to 15 bytes) at the
//!    start, or the next one the trace shows (a rename shows late). Requests
//!    take their threads surest first; one whose thread is taken by an
//!    overlapping request takes the next credible thread of the same
//!    process (a pool); two overlapping requests swap threads when that
//!    fits both better in sum (two hand-offs at once).
//! 3. **Process level**: where no single thread is credible — the span's
//!    runtime moves requests between threads (`telemetry.sdk.language`
//!    `go`: goroutines), none ran near both ends with the request's I/O,
//!    or the best thread serves requests interleaved (an event loop:
//!    asyncio, Node) — the request is placed on its process as a whole,
//!    never on an invented thread.
//!
//! Spans inside a request (internal, client) go where their request went.
//! Every placement says why ([`Placement::evidence`]) and how sure it is
//! ([`Placement::confidence`], 0 to 1).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use deepspan_model::{human, Tid};

use crate::request::SpanIdx;
use crate::state::{
    BlockReason, KernelModel, StateInterval, SyscallInterval, ThreadHistory, ThreadState,
};
use crate::syscalls::{syscall_name, Arch};

/// Farthest a thread's run may be from a span's start or end for the
/// thread to have made that span (the span's times are taken while it
/// runs; the mapping error and missed switch-ins move it a little).
pub const RUN_LIMIT_NS: u64 = 20_000_000;

/// Farthest a receive may be before a span's start, or a send from its end,
/// to count as the request's (a request read, then queued for a CPU under
/// a quota, can take this long to start its span).
pub const IO_WINDOW_NS: u64 = 1_000_000_000;

/// Farthest a thread's receive may be before it wakes a pool thread for
/// the wake-up to hand that request over (reading and parsing a request,
/// then queueing it, takes well under this even on a loaded machine).
pub const HANDOFF_RECEIVE_NS: u64 = 20_000_000;

/// Fewest requests a thread must hand to other threads (as the hand-off of
/// their best fit) to be taken for an acceptor, which never serves one.
const MIN_HANDOFFS: usize = 4;

/// How much more a µs between the span's start (end) and the thread's run
/// costs than a µs between its I/O and the span: a span's times are taken
/// while its thread runs (off only by the clock mapping's µs), whereas a
/// request may wait long between its receive and its start (for a lock, an
/// interpreter lock, a CPU).
pub const RUN_WEIGHT: u64 = 8;

/// What a missing receive or send costs a thread's score: a thread with
/// both beats one without unless the other is far off.
pub const MISSING_IO_COST_NS: u64 = 50_000_000;

/// One span, as placement needs it.
#[derive(Clone, Debug, Default)]
pub struct PlacementSpan {
    /// Index of the parent span in the same slice.
    pub parent: Option<SpanIdx>,
    /// A server or consumer span: it starts a request.
    pub entry: bool,
    /// Start and end on the kernel clock (mapped wall times).
    pub times: Option<(u64, u64)>,
    /// The span carries deepspan fields: placed by them, not inferred.
    pub sdk_placed: bool,
    /// Resource `process.pid`.
    pub pid: Option<Tid>,
    /// Resource `service.name`.
    pub service: String,
    /// `thread.name` attribute.
    pub thread_name: Option<String>,
    /// The port the request came in on (`server.port`, `net.host.port`,
    /// `url.full` …).
    pub port: Option<u16>,
    /// The client's port (`client.port`, `net.peer.port`,
    /// `network.peer.port`): with [`PlacementSpan::port`], the connection.
    pub client_port: Option<u16>,
    /// Resource `telemetry.sdk.language` (`go`, `java`, `python` …): some
    /// runtimes run a request on whichever OS thread is free
    /// ([`runs_requests_on_any_thread`]).
    pub sdk_language: Option<String>,
}

/// Runtimes that schedule their own tasks onto OS threads (M:N) and move a
/// task to another thread at any blocking point or preemption: Go's
/// goroutines, the BEAM's processes. A thread that ran at a request's start
/// and end and did its I/O may have run other requests in between, and the
/// request other threads: no thread is the request's own, so its process
/// is (`sync: process`). Event loops (Node, asyncio) are found from the
/// trace instead: a request that overlaps no other is their loop thread's.
pub fn runs_requests_on_any_thread(sdk_language: &str) -> bool {
    matches!(sdk_language, "go" | "erlang")
}

/// A process seen by the recorder's /proc scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScannedProcess {
    pub pid: Tid,
    pub comm: String,
    /// Arguments joined by spaces.
    pub cmdline: String,
    /// TCP ports it listened on.
    pub listening_ports: Vec<u16>,
    /// The container and pod its cgroup named.
    pub container: Option<deepspan_model::container::Container>,
}

/// What is known about processes besides the kernel model.
#[derive(Clone, Debug, Default)]
pub struct Processes {
    /// Thread → thread-group (process) id, from the recording.
    pub tgid_of: HashMap<Tid, Tid>,
    /// The recorder's /proc scan, if any.
    pub scanned: Vec<ScannedProcess>,
}

/// How a span was placed without deepspan fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlacementMethod {
    /// On one thread, found from its system calls and runs.
    Thread,
    /// On its process as a whole: no single thread is credible.
    Process,
}

impl PlacementMethod {
    /// `inferred` (on a thread) or `process`: the request's `sync`.
    pub fn name(self) -> &'static str {
        match self {
            PlacementMethod::Thread => "inferred",
            PlacementMethod::Process => "process",
        }
    }
}

/// Where a span was placed, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub method: PlacementMethod,
    pub pid: Tid,
    /// The thread ([`PlacementMethod::Thread`] only).
    pub tid: Option<Tid>,
    /// 0 (a guess) to 1 (no other reading of the trace fits).
    pub confidence: f64,
    /// What the placement rests on, one fact per line.
    pub evidence: Vec<String>,
}

/// Places every span that has no deepspan fields: `result[i]` is span `i`'s
/// placement (`None`: SDK-placed, no times, or nothing credible).
///
/// The passes, in order (each function's doc says its rule):
/// 1. [`Finder::candidates`]: every request's process(es) and the threads
///    of them that fit it, best first;
/// 2. [`name_processes_by_vote`]: a service that names no process is
///    served by the one most of its requests fit best;
/// 3. [`pass_over_acceptors`]: threads that hand requests to others serve
///    none;
/// 4. [`on_processes`]: requests of runtimes that move them between
///    threads, and those an event loop fits best, go to their process;
/// 5. [`surest_first`]: the others take threads, surest first, each its
///    best one not already carrying an overlapping request;
/// 6. [`uncross`]: two overlapping requests swap threads when that fits
///    both better;
/// 7. [`shared_threads_to_processes`]: requests left sharing a thread (an
///    event loop pass 4 did not see) go to their process;
/// 8. [`children_follow_their_requests`]: the spans inside a request go
///    where it went.
pub fn infer_placements(
    model: &KernelModel,
    arch: Arch,
    spans: &[PlacementSpan],
    processes: &Processes,
) -> Vec<Option<Placement>> {
    let finder = Finder::new(model, arch, processes);
    let request_of = requests_of(spans);
    let mut requests: Vec<(usize, Candidates)> = spans
        .iter()
        .enumerate()
        .filter(|(i, span)| request_of[*i] == *i && !span.sdk_placed)
        .filter_map(|(i, span)| Some((i, finder.candidates(span)?)))
        .collect();
    name_processes_by_vote(spans, &mut requests);
    pass_over_acceptors(&finder, &mut requests);
    let mut out: Vec<Option<Placement>> = vec![None; spans.len()];
    let on_threads = on_processes(&requests, &mut out);
    let mut threads = surest_first(&requests, on_threads, &mut out);
    uncross(&requests, &mut threads.taken, &mut out);
    shared_threads_to_processes(&requests, &threads, &mut out);
    children_follow_their_requests(spans, &request_of, &mut out);
    out
}

/// Spans inside a request (internal, client) go where their request went.
fn children_follow_their_requests(
    spans: &[PlacementSpan],
    request_of: &[usize],
    out: &mut [Option<Placement>],
) {
    for (i, span) in spans.iter().enumerate() {
        let r = request_of[i];
        if r == i || span.sdk_placed || span.times.is_none() {
            continue;
        }
        if let Some(p) = out[r].clone() {
            out[i] = Some(Placement {
                evidence: vec!["inside its request: placed like it".to_string()],
                ..p
            });
        }
    }
}

/// The request (index) of every span: itself when it is a root or an entry,
/// else its nearest such ancestor.
fn requests_of(spans: &[PlacementSpan]) -> Vec<usize> {
    (0..spans.len())
        .map(|i| {
            let mut cur = i;
            for _ in 0..4096 {
                let s = &spans[cur];
                match s.parent {
                    Some(p) if !s.entry && (p as usize) < spans.len() => cur = p as usize,
                    _ => return cur,
                }
            }
            i
        })
        .collect()
}

/// What kind of I/O a system call is, for placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Io {
    /// Socket receive (recvfrom, recvmsg …): strong.
    Receive,
    /// read/readv: a socket or not.
    Read,
    /// Socket send.
    Send,
    /// write/writev: a socket or not.
    Write,
    Other,
}

fn io_kind(name: &str) -> Io {
    match name.strip_prefix("sys_").unwrap_or(name) {
        "recvfrom" | "recvmsg" | "recvmmsg" | "recv" => Io::Receive,
        "read" | "readv" => Io::Read,
        "sendto" | "sendmsg" | "sendmmsg" | "send" | "sendfile" | "sendfile64" => Io::Send,
        "write" | "writev" => Io::Write,
        _ => Io::Other,
    }
}

/// Time between a request's I/O and its span's start (or end) on a thread.
///
/// Only the part the thread was not waiting for a CPU counts against it: a
/// request read, then held off the CPU by a quota (90 ms a period) or other
/// load, starts its span that much later on the very thread that read it,
/// while another thread's I/O may happen to lie nearer. Time blocked counts:
/// a request may wait for a lock, but so may another thread's.
#[derive(Clone, Copy, Debug)]
struct Gap {
    wall: u64,
    /// Of `wall`, time the thread was runnable but off the CPU.
    cpu_wait: u64,
}

impl Gap {
    /// The gap `[a, b]` on thread `th` (in either order).
    fn on(th: &ThreadHistory, a: u64, b: u64) -> Gap {
        let (a, b) = (a.min(b), a.max(b));
        let cpu_wait = th
            .states_in(a, b)
            .iter()
            .filter(|s| s.state.is_runnable())
            .map(|s| s.end.min(b).saturating_sub(s.start.max(a)))
            .sum::<u64>();
        Gap {
            wall: b - a,
            cpu_wait: cpu_wait.min(b - a),
        }
    }

    /// What counts against the thread.
    fn counted(self) -> u64 {
        self.wall - self.cpu_wait
    }

    /// "1.2 ms", or "91.0 ms (90.0 ms of it waiting for a CPU)".
    fn describe(self) -> String {
        if self.cpu_wait < 1_000 {
            human::duration(self.wall)
        } else {
            format!(
                "{} ({} of it waiting for a CPU)",
                human::duration(self.wall),
                human::duration(self.cpu_wait)
            )
        }
    }
}

/// The connection a request came on, as its span names it. A receive or
/// send whose socket the recording named ([`SyscallInterval::socket`]) is
/// the request's only on the server end of that connection; one with no
/// named socket (a trace with the system-call events, a span without the
/// client's port) may be any request's, as time alone says.
#[derive(Clone, Copy, Debug, Default)]
struct Connection {
    client_port: Option<u16>,
    server_port: Option<u16>,
}

impl Connection {
    fn of(span: &PlacementSpan) -> Connection {
        Connection {
            client_port: span.client_port,
            server_port: span.port,
        }
    }

    /// Whether the call may be the request's.
    fn admits(&self, call: &SyscallInterval) -> bool {
        match (self.client_port, call.socket()) {
            (Some(client), Some(socket)) => socket.serves(client, self.server_port),
            _ => true,
        }
    }

    /// Whether the call is known to be on this connection.
    fn is_on(&self, call: &SyscallInterval) -> bool {
        self.client_port.is_some() && call.socket().is_some() && self.admits(call)
    }
}

/// A candidate thread's fit to a request.
#[derive(Clone, Debug)]
struct Fit {
    tid: Tid,
    pid: Tid,
    /// Distance from the start (end) to the thread's nearest run.
    run_start: u64,
    run_end: u64,
    /// Receive before the start: (gap, by the thread that woke it).
    receive: Option<(Gap, Option<Tid>, &'static str)>,
    /// Send nearest the end: gap.
    send: Option<(Gap, &'static str)>,
    name_matched: bool,
    /// The receive is an acceptor's, taken from its queue by this thread
    /// without a wake-up (it was busy when the request was queued).
    queued: bool,
}

impl Fit {
    fn cost(&self) -> u64 {
        RUN_WEIGHT * (self.run_start + self.run_end)
            + self.receive.map_or(MISSING_IO_COST_NS, |r| {
                r.0.counted().min(MISSING_IO_COST_NS)
            })
            + self.send.map_or(MISSING_IO_COST_NS, |s| {
                s.0.counted().min(MISSING_IO_COST_NS)
            })
    }
}

struct Finder<'a> {
    model: &'a KernelModel,
    arch: Arch,
    processes: &'a Processes,
    /// Process → its threads.
    threads_of: BTreeMap<Tid, Vec<Tid>>,
    /// Port → the processes whose threads received or sent on a connected
    /// socket of that local port (the socket-call capture): a server's
    /// port, seen in the trace even when no /proc scan caught its listener.
    answering_on: BTreeMap<u16, Vec<Tid>>,
    /// Thread → the ends of its socket sends, in order, made on first use:
    /// a hand-off's search starts at the thread's last send, and walking
    /// back through a second of a busy thread's calls for it took most of
    /// the placement's time (about 1 ms a span).
    sends: RefCell<HashMap<Tid, Rc<[u64]>>>,
}

impl<'a> Finder<'a> {
    fn new(model: &'a KernelModel, arch: Arch, processes: &'a Processes) -> Finder<'a> {
        let mut threads_of: BTreeMap<Tid, Vec<Tid>> = BTreeMap::new();
        let mut answering_on: BTreeMap<u16, Vec<Tid>> = BTreeMap::new();
        for th in model.threads() {
            if th.tid <= 0 {
                continue;
            }
            let Some(pid) = pid_of(th, processes) else {
                continue;
            };
            threads_of.entry(pid).or_default().push(th.tid);
            let ports = th.syscalls().iter().filter_map(|c| c.socket());
            for socket in ports.filter(|s| s.local_port != 0 && s.remote_port != 0) {
                let pids = answering_on.entry(socket.local_port).or_default();
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        Finder {
            model,
            arch,
            processes,
            threads_of,
            answering_on,
            sends: RefCell::default(),
        }
    }

    /// The end of `th`'s last socket send that ended at or before `t` and
    /// at or after `since`.
    fn last_send(&self, th: &ThreadHistory, since: u64, t: u64) -> Option<u64> {
        let ends = {
            let mut sends = self.sends.borrow_mut();
            sends
                .entry(th.tid)
                .or_insert_with(|| {
                    th.syscalls()
                        .iter()
                        .filter(|s| self.io(s) == Io::Send)
                        .map(|s| s.end)
                        .collect()
                })
                .clone()
        };
        // A thread's calls do not overlap: their ends are in order too.
        let i = ends.partition_point(|&end| end <= t);
        ends[..i].last().copied().filter(|&end| end >= since)
    }

    fn io(&self, s: &SyscallInterval) -> Io {
        let name = self
            .model
            .syscall_name(s)
            .or_else(|| syscall_name(self.arch, s.id));
        name.map_or(Io::Other, io_kind)
    }

    /// The processes the span may come from, what says so, and how sure.
    fn processes_for(&self, span: &PlacementSpan) -> (Vec<Tid>, String, f64) {
        if let Some(pid) = span.pid.filter(|p| self.threads_of.contains_key(p)) {
            return (
                vec![pid],
                format!("process {pid} from the resource's process.pid"),
                1.0,
            );
        }
        let service = span.service.as_str();
        if !service.is_empty() && !service.starts_with("unknown_service") {
            let cut: String =
                String::from_utf8_lossy(&service.as_bytes()[..service.len().min(15)]).into();
            let by_comm: Vec<Tid> = self
                .threads_of
                .iter()
                .filter(|(pid, tids)| {
                    let leader = self.model.thread(**pid).into_iter();
                    leader
                        .chain(tids.iter().filter_map(|t| self.model.thread(*t)))
                        .any(|th| th.names().iter().any(|n| n.1.to_string_lossy() == cut))
                })
                .map(|(p, _)| *p)
                .collect();
            if !by_comm.is_empty() {
                let n = by_comm.len();
                return (
                    self.narrow_by_port(by_comm, span),
                    format!("service.name {service:?} is the name of {n} process(es)"),
                    0.9,
                );
            }
            let by_cmdline: Vec<Tid> = self
                .processes
                .scanned
                .iter()
                .filter(|p| names_service(&p.cmdline, service))
                .map(|p| p.pid)
                .filter(|p| self.threads_of.contains_key(p))
                .collect();
            if !by_cmdline.is_empty() {
                let n = by_cmdline.len();
                return (
                    self.narrow_by_port(by_cmdline, span),
                    format!("service.name {service:?} is in the command line of {n} process(es)"),
                    0.8,
                );
            }
        }
        if let Some(port) = span.port {
            let listening: Vec<Tid> = self
                .processes
                .scanned
                .iter()
                .filter(|p| p.listening_ports.contains(&port))
                .map(|p| p.pid)
                .filter(|p| self.threads_of.contains_key(p))
                .collect();
            if !listening.is_empty() {
                return (
                    listening,
                    format!("the process listening on port {port}"),
                    0.8,
                );
            }
            // A server that listened between two /proc scans.
            if let Some(answering) = self.answering_on.get(&port) {
                return (
                    answering.clone(),
                    format!("the process whose threads received and sent on port {port}"),
                    0.8,
                );
            }
        }
        (
            self.threads_of.keys().copied().collect(),
            "no process named: every process considered".into(),
            0.5,
        )
    }

    fn narrow_by_port(&self, pids: Vec<Tid>, span: &PlacementSpan) -> Vec<Tid> {
        let Some(port) = span.port else { return pids };
        let listening: Vec<Tid> = pids
            .iter()
            .copied()
            .filter(|p| {
                self.processes
                    .scanned
                    .iter()
                    .any(|s| s.pid == *p && s.listening_ports.contains(&port))
            })
            .collect();
        if listening.is_empty() {
            pids
        } else {
            listening
        }
    }

    /// Every thread of the span's process(es) that could have served it,
    /// best fit first.
    fn candidates(&self, span: &PlacementSpan) -> Option<Candidates> {
        let (start, end) = span.times?;
        let (pids, process_evidence, process_confidence) = self.processes_for(span);
        let fits_on = |conn: &Connection| {
            let mut fits: Vec<Fit> = Vec::new();
            for &pid in &pids {
                for &tid in self.threads_of.get(&pid).into_iter().flatten() {
                    let name = span.thread_name.as_deref();
                    if let Some(f) = self.fit(tid, pid, start, end, name, conn) {
                        fits.push(f);
                    }
                }
            }
            fits
        };
        let mut conn = Connection::of(span);
        let mut fits = fits_on(&conn);
        if conn.client_port.is_some()
            && fits.iter().all(|f| f.receive.is_none() && f.send.is_none())
        {
            // No thread of the process did I/O on the connection the span
            // names (a proxy between, a port the SDK took from a header):
            // placed as if it named none.
            conn = Connection::default();
            fits = fits_on(&conn);
        }
        fits.sort_by_key(|f| (f.cost(), f.tid));
        Some(Candidates {
            start,
            end,
            any_thread_runtime: span
                .sdk_language
                .as_deref()
                .filter(|l| runs_requests_on_any_thread(l))
                .map(str::to_string),
            named: process_confidence > 0.5,
            pids,
            process_evidence,
            process_confidence,
            fits,
            conn,
            notes: Vec::new(),
        })
    }
}

/// The threads that could have served one request.
struct Candidates {
    start: u64,
    end: u64,
    /// The span's SDK language when its runtime moves requests between
    /// threads (Go): placed on the process, never on a thread.
    any_thread_runtime: Option<String>,
    /// The process was named by the span (pid, service, port).
    named: bool,
    pids: Vec<Tid>,
    process_evidence: String,
    process_confidence: f64,
    /// Best first.
    fits: Vec<Fit>,
    /// The connection the fits' I/O is on.
    conn: Connection,
    /// Threads passed over before the fits were scored, and why.
    notes: Vec<String>,
}

impl Candidates {
    /// A thread that ran near both ends and did the request's I/O (both
    /// receive and send when the process was not named).
    fn credible(&self, f: &Fit) -> bool {
        f.run_start <= RUN_LIMIT_NS
            && f.run_end <= RUN_LIMIT_NS
            && (f.receive.is_some() || f.send.is_some())
            && (self.named || (f.receive.is_some() && f.send.is_some()))
    }

    /// Placed on its process as a whole.
    fn on_process(&self, why: String) -> Option<Placement> {
        if !self.named || self.pids.len() != 1 {
            return None;
        }
        Some(Placement {
            method: PlacementMethod::Process,
            pid: self.pids[0],
            tid: None,
            confidence: self.process_confidence * 0.5,
            evidence: [self.process_evidence.clone()]
                .into_iter()
                .chain(self.notes.iter().cloned())
                .chain([why])
                .collect(),
        })
    }

    /// Placed on its process as a whole because its runtime moves requests
    /// between threads (`language`): the named process, else, among several
    /// of the name, the one whose thread fits best.
    fn on_any_thread_process(&self, language: &str) -> Option<Placement> {
        let why = format!(
            "telemetry.sdk.language is {language:?}: its runtime runs a request on any free OS thread, so none is the request's own"
        );
        if let Some(p) = self.on_process(why.clone()) {
            return Some(p);
        }
        let best = self.fits.first().filter(|f| self.credible(f))?;
        Some(Placement {
            method: PlacementMethod::Process,
            pid: best.pid,
            tid: None,
            confidence: self.process_confidence * 0.5,
            evidence: vec![
                self.process_evidence.clone(),
                format!(
                    "process {}: its thread {} fits the request best",
                    best.pid, best.tid
                ),
                why,
            ],
        })
    }

    /// Placed on the thread of `fits[k]`.
    fn on_thread(&self, k: usize, passed_over: &[String]) -> Placement {
        let best = &self.fits[k];
        let mut evidence = vec![self.process_evidence.clone()];
        evidence.extend(self.notes.iter().cloned());
        evidence.extend(passed_over.iter().cloned());
        evidence.push(format!(
            "thread {} ran {} from the start and {} from the end",
            best.tid,
            human::duration(best.run_start),
            human::duration(best.run_end)
        ));
        if let Some((gap, waker, call)) = best.receive {
            match waker {
                Some(w) if best.queued => evidence.push(format!(
                    "{call} returned {} before the start on acceptor thread {w}; no wake-up: it took the request from the queue",
                    gap.describe()
                )),
                Some(w) => evidence.push(format!(
                    "{call} returned {} before the start on thread {w}, which then woke it (hand-off)",
                    gap.describe()
                )),
                None => evidence.push(format!("{call} returned {} before the start", gap.describe())),
            }
        }
        if let Some((gap, call)) = best.send {
            evidence.push(format!("{call} {} from the end", gap.describe()));
        }
        if best.name_matched {
            evidence.push("thread.name is its comm".into());
        }
        // Sure when the next best thread fits much worse.
        let margin = match self.fits.get(k + 1) {
            Some(next) => {
                let (a, b) = (best.cost() as f64, next.cost() as f64);
                ((b - a) / b.max(1.0)).clamp(0.0, 1.0)
            }
            None => 1.0,
        };
        let io = match (best.receive.is_some(), best.send.is_some()) {
            (true, true) => 1.0,
            _ => 0.7,
        };
        let passed = if passed_over.is_empty() { 1.0 } else { 0.8 };
        Placement {
            method: PlacementMethod::Thread,
            pid: best.pid,
            tid: Some(best.tid),
            confidence: self.process_confidence * io * passed * (0.5 + 0.5 * margin),
            evidence,
        }
    }
}

/// A service whose spans name no process (no `process.pid`, a name that is
/// no process's, no known port) is served by one process all the same: the
/// one where most of its requests fit best. Its requests are then placed in
/// that process only, so a client process (which also sends and receives
/// around each request) cannot take them.
fn name_processes_by_vote(spans: &[PlacementSpan], requests: &mut [(usize, Candidates)]) {
    let mut votes: HashMap<&str, BTreeMap<Tid, usize>> = HashMap::new();
    for (i, c) in requests.iter() {
        if c.named {
            continue;
        }
        let best = c.fits.first().filter(|f| c.credible(f));
        let tally = votes.entry(spans[*i].service.as_str()).or_default();
        if let Some(f) = best {
            *tally.entry(f.pid).or_default() += 1;
        }
    }
    let winners: HashMap<&str, (Tid, usize, usize)> = votes
        .into_iter()
        .filter_map(|(service, tally)| {
            let total: usize = tally.values().sum();
            let (&pid, &n) = tally
                .iter()
                .max_by_key(|(pid, n)| (**n, std::cmp::Reverse(**pid)))?;
            // A majority, not a plurality of scattered guesses.
            (n * 2 > total).then_some((service, (pid, n, total)))
        })
        .collect();
    for (i, c) in requests.iter_mut() {
        if c.named {
            continue;
        }
        let service = spans[*i].service.as_str();
        let Some(&(pid, n, total)) = winners.get(service) else {
            continue;
        };
        c.fits.retain(|f| f.pid == pid);
        c.pids = vec![pid];
        c.named = true;
        c.process_confidence = 0.6;
        c.process_evidence = format!(
            "no process named by the span; process {pid} is where {n} of {total} requests of service {service:?} fit best"
        );
    }
}

/// An acceptor (or event loop) that reads requests and hands each to a pool
/// thread ran and received just before every one of them, so it fits them
/// too — but it served none. A thread that handed over the best fit's
/// request of at least [`MIN_HANDOFFS`] requests is such a thread: it is
/// no candidate for any request (its requests, if it ran some itself, go
/// to the next credible thread, or to the process). A pool thread that
/// took a request from the queue without being woken for it (it was busy
/// when the request was queued) shows no hand-off: its receive is the
/// acceptor's last before the start.
fn pass_over_acceptors(finder: &Finder, requests: &mut [(usize, Candidates)]) {
    let mut handed: BTreeMap<Tid, usize> = BTreeMap::new();
    for (_, c) in requests.iter() {
        let waker = c
            .fits
            .first()
            .filter(|f| c.credible(f))
            .and_then(|f| f.receive)
            .and_then(|r| r.1);
        if let Some(w) = waker {
            *handed.entry(w).or_default() += 1;
        }
    }
    handed.retain(|_, n| *n >= MIN_HANDOFFS);
    if handed.is_empty() {
        return;
    }
    for (_, c) in requests.iter_mut() {
        for f in c.fits.iter().filter(|f| handed.contains_key(&f.tid)) {
            if c.credible(f) {
                c.notes.push(format!(
                    "thread {} passed over: an acceptor, it handed {} requests to other threads",
                    f.tid, handed[&f.tid]
                ));
            }
        }
        c.fits.retain(|f| !handed.contains_key(&f.tid));
        // The process's acceptors, latest receive first.
        for f in c.fits.iter_mut().filter(|f| f.receive.is_none()) {
            let queued = handed
                .keys()
                .filter_map(|&a| {
                    let th = finder.model.thread(a)?;
                    (pid_of(th, finder.processes) == Some(f.pid)).then_some(())?;
                    let (gap, call) = finder.receive_before(th, c.start, &c.conn)?;
                    Some((gap, a, call))
                })
                .min_by_key(|r| r.0);
            // Between the acceptor's receive and the start, the request
            // waited in the queue while this thread finished another.
            let pool_thread = finder.model.thread(f.tid);
            if let (Some((gap, a, call)), Some(th)) = (queued, pool_thread) {
                f.receive = Some((
                    Gap::on(th, c.start.saturating_sub(gap), c.start),
                    Some(a),
                    call,
                ));
                f.queued = true;
            }
        }
        c.fits.sort_by_key(|f| (f.cost(), f.tid));
    }
}

/// Fewest interleaved requests that make a thread an event loop.
const MIN_INTERLEAVED: usize = 4;

/// Threads that serve requests interleaved: of the requests a thread fits
/// best, at least a quarter, and [`MIN_INTERLEAVED`], overlap another of
/// them, were run by it at both ends (within [`LOOP_RUN_SLACK_NS`]) and
/// fit no other thread of the process about as well. A pool thread, which
/// serves one request at a time, is only now and then the best fit of two
/// requests at once (two threads with similar I/O, or a request handed to
/// another pool thread at the same time): the assignment gives one of them
/// the next best thread.
/// `(tid, overlapping, of)`.
fn event_loops(requests: &[(usize, Candidates)]) -> Vec<(Tid, usize, usize)> {
    // Per best thread: (start, end, whether another thread of the same
    // process fits about as well, or the thread ran not quite at the ends).
    let mut by_tid: BTreeMap<Tid, Vec<(u64, u64, bool)>> = BTreeMap::new();
    for (_, c) in requests {
        let Some(best) = c.fits.first().filter(|f| c.credible(f)) else {
            continue;
        };
        // A loop runs at both ends of each of its requests; a pool thread
        // that only ran near the ends of a request (another thread's,
        // handed over at the same time) is no sign of interleaving.
        let alternative = best.run_start + best.run_end > LOOP_RUN_SLACK_NS
            || c.fits[1..].iter().any(|f| {
                f.pid == best.pid
                    && c.credible(f)
                    && f.cost() <= 2 * best.cost() + GOOD_ALTERNATIVE_NS
            });
        by_tid
            .entry(best.tid)
            .or_default()
            .push((c.start, c.end, alternative));
    }
    let mut out = Vec::new();
    for (tid, mut v) in by_tid {
        v.sort_unstable();
        let mut overlapping = vec![false; v.len()];
        // The request reaching furthest so far, and its index.
        let mut reach: Option<(u64, usize)> = None;
        for (k, &(s, e, _)) in v.iter().enumerate() {
            if let Some((end, j)) = reach {
                if s + OVERLAP_SLACK_NS < end {
                    overlapping[k] = true;
                    overlapping[j] = true;
                }
            }
            if reach.is_none_or(|(end, _)| e > end) {
                reach = Some((e, k));
            }
        }
        // Interleaved requests another thread could as well have served
        // are a pool's, sorted out by the assignment.
        let n = v
            .iter()
            .zip(&overlapping)
            .filter(|(r, o)| **o && !r.2)
            .count();
        if n >= MIN_INTERLEAVED && n * 4 >= v.len() {
            out.push((tid, n, v.len()));
        }
    }
    out
}

/// Farthest an event loop's run may be from its requests' start and end
/// (summed): the clock mapping's error, and a little more.
const LOOP_RUN_SLACK_NS: u64 = 30_000;

/// Slack on "about as good" for another thread's fit (twice the cost, plus
/// this): pool threads doing the same work fit alike.
const GOOD_ALTERNATIVE_NS: u64 = 200_000;

/// Requests overlapping by more than this on one thread were not both its
/// (the mapping error is µs).
const OVERLAP_SLACK_NS: u64 = 100_000;

/// Requests that no single thread can be said to have served go to their
/// process: those of a runtime that moves requests between threads
/// ([`runs_requests_on_any_thread`]), and those whose best thread is an
/// event loop ([`event_loops`]). The others, by index in `requests`,
/// surest first (lowest cost), are left for the threads.
fn on_processes(requests: &[(usize, Candidates)], out: &mut [Option<Placement>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&k| {
        let c = &requests[k].1;
        (c.fits.first().map_or(u64::MAX, Fit::cost), requests[k].0)
    });
    let loops = event_loops(requests);
    order.retain(|&k| {
        let (i, c) = (requests[k].0, &requests[k].1);
        if let Some(language) = &c.any_thread_runtime {
            out[i] = c.on_any_thread_process(language);
            return false;
        }
        let best_loop = c
            .fits
            .first()
            .filter(|f| c.credible(f))
            .and_then(|f| loops.iter().find(|l| l.0 == f.tid));
        if let Some(&(tid, overlapping, of)) = best_loop {
            out[i] = c.on_process(format!(
                "thread {tid} serves requests interleaved (an event loop: {overlapping} of the {of} requests it fits best overlap another)"
            ));
            return false;
        }
        true
    });
    order
}

/// Requests placed on threads, per thread.
#[derive(Default)]
struct Threads {
    /// Per thread: (start, end, request index in `requests`).
    taken: HashMap<Tid, Vec<(u64, u64, usize)>>,
    /// Requests that found their best thread carrying an overlapping
    /// request and no other credible thread free: (request, that thread).
    shared: Vec<(usize, Tid)>,
}

/// Gives each request of `order` (surest first) its best credible thread
/// not already carrying an overlapping request: another thread of the same
/// process (a pool), never of another. A request with no credible thread
/// goes to its process; one whose credible threads are all taken is left
/// in [`Threads::shared`].
fn surest_first(
    requests: &[(usize, Candidates)],
    order: Vec<usize>,
    out: &mut [Option<Placement>],
) -> Threads {
    let mut threads = Threads::default();
    let mut by_start: HashMap<Tid, ByStart> = HashMap::new();
    for k in order {
        let (i, c) = (requests[k].0, &requests[k].1);
        let mut passed_over = Vec::new();
        let mut placed = None;
        let first_pid = c.fits.first().map(|f| f.pid);
        for (n, f) in c.fits.iter().enumerate() {
            if !c.credible(f) || Some(f.pid) != first_pid {
                break;
            }
            let first = by_start
                .get(&f.tid)
                .and_then(|b| b.first_overlapping(c.start, c.end));
            match first.map(|at| threads.taken[&f.tid][at].2) {
                Some(other) => {
                    if passed_over.is_empty() {
                        threads.shared.push((k, f.tid));
                    }
                    passed_over.push(format!(
                        "thread {} fits but carried request span #{} at the same time",
                        f.tid, requests[other].0
                    ));
                }
                None => {
                    placed = Some(c.on_thread(n, &passed_over));
                    break;
                }
            }
        }
        match placed {
            Some(p) => {
                let tid = p.tid.expect("placed on a thread");
                let on_thread = threads.taken.entry(tid).or_default();
                by_start
                    .entry(tid)
                    .or_default()
                    .insert(c.start, c.end, on_thread.len());
                on_thread.push((c.start, c.end, k));
                threads.shared.retain(|x| x.0 != k);
                out[i] = Some(p);
            }
            None if passed_over.is_empty() => {
                out[i] = c.on_process(
                    "no single thread ran at both the start and the end with the request's I/O"
                        .into(),
                );
            }
            None => {}
        }
    }
    threads
}

/// The requests placed on one thread by [`surest_first`], by start: the
/// overlap test of each new request against every request of a busy
/// thread made placement quadratic (10⁵ spans took minutes).
#[derive(Default)]
struct ByStart {
    /// (start, place in the thread's `taken`) → end.
    starts: BTreeMap<(u64, usize), u64>,
    /// The longest request: none that starts earlier than this before a
    /// time can reach it.
    longest: u64,
}

impl ByStart {
    fn insert(&mut self, start: u64, end: u64, at: usize) {
        self.starts.insert((start, at), end);
        self.longest = self.longest.max(end.saturating_sub(start));
    }

    /// The first placed (lowest place) of the requests overlapping
    /// `[start, end]` by more than [`OVERLAP_SLACK_NS`].
    fn first_overlapping(&self, start: u64, end: u64) -> Option<usize> {
        // x overlaps when start + slack < x.end and x.start + slack < end.
        let last_start = end.checked_sub(OVERLAP_SLACK_NS + 1)?;
        let first_start = (start + OVERLAP_SLACK_NS).saturating_sub(self.longest);
        if first_start > last_start {
            return None;
        }
        self.starts
            .range((first_start, 0)..=(last_start, usize::MAX))
            .filter(|(_, &x_end)| start + OVERLAP_SLACK_NS < x_end)
            .map(|(&(_, at), _)| at)
            .min()
    }
}

/// Event loops the scores did not show: a request left sharing a thread
/// with overlapping requests goes to its process, and so do the requests
/// placed on that thread over the same time.
fn shared_threads_to_processes(
    requests: &[(usize, Candidates)],
    threads: &Threads,
    out: &mut [Option<Placement>],
) {
    for &(k, tid) in &threads.shared {
        let c = &requests[k].1;
        let why = format!("thread {tid} carried requests overlapping in time (an event loop)");
        out[requests[k].0] = c.on_process(why.clone());
        for &(s, e, holder) in threads.taken.get(&tid).into_iter().flatten() {
            if s + OVERLAP_SLACK_NS < c.end && c.start + OVERLAP_SLACK_NS < e {
                let i = requests[holder].0;
                if out[i]
                    .as_ref()
                    .is_some_and(|p| p.method == PlacementMethod::Thread)
                {
                    out[i] = requests[holder].1.on_process(why.clone());
                }
            }
        }
    }
}

/// Most rounds of [`uncross`] (each swaps every crossed pair it finds).
const UNCROSS_ROUNDS: usize = 8;

/// Surest first is greedy: two requests handed to two pool threads within
/// µs of each other both fit both threads, and the surer one may take the
/// other's thread (its own fits a little worse, the other's much worse).
/// Swaps the threads of two overlapping requests placed on threads of one
/// process whenever each is credible on the other's thread, neither then
/// overlaps a third request there, and their summed cost falls.
fn uncross(
    requests: &[(usize, Candidates)],
    taken: &mut HashMap<Tid, Vec<(u64, u64, usize)>>,
    out: &mut [Option<Placement>],
) {
    let cost_on = |k: usize, tid: Tid| {
        let c = &requests[k].1;
        c.fits
            .iter()
            .position(|f| f.tid == tid && c.credible(f))
            .map(|n| (n, c.fits[n].cost()))
    };
    let free_for =
        |taken: &HashMap<Tid, Vec<(u64, u64, usize)>>, tid: Tid, k: usize, but: usize| {
            let c = &requests[k].1;
            taken.get(&tid).into_iter().flatten().all(|x| {
                x.2 == but
                    || x.2 == k
                    || !(c.start + OVERLAP_SLACK_NS < x.1 && x.0 + OVERLAP_SLACK_NS < c.end)
            })
        };
    for _ in 0..UNCROSS_ROUNDS {
        // (start, end, request, thread), by start.
        let mut placed: Vec<(u64, u64, usize, Tid)> = taken
            .iter()
            .flat_map(|(tid, v)| v.iter().map(|&(s, e, k)| (s, e, k, *tid)))
            .collect();
        placed.sort_unstable();
        let mut swapped = false;
        for a in 0..placed.len() {
            for b in a + 1..placed.len() {
                let (sa, ea, ka, ta) = placed[a];
                let (sb, eb, kb, tb) = placed[b];
                if sb >= ea {
                    break;
                }
                if ta == tb || eb <= sa {
                    continue;
                }
                let (Some((_, now_a)), Some((_, now_b))) = (cost_on(ka, ta), cost_on(kb, tb))
                else {
                    continue;
                };
                let (Some((na, cross_a)), Some((nb, cross_b))) = (cost_on(ka, tb), cost_on(kb, ta))
                else {
                    continue;
                };
                if cross_a + cross_b >= now_a + now_b
                    || !free_for(taken, tb, ka, kb)
                    || !free_for(taken, ta, kb, ka)
                {
                    continue;
                }
                for (k, from, to) in [(ka, ta, tb), (kb, tb, ta)] {
                    let v = taken.get_mut(&from).expect("placed");
                    v.retain(|x| x.2 != k);
                    let c = &requests[k].1;
                    taken.entry(to).or_default().push((c.start, c.end, k));
                }
                let (ia, ib) = (requests[ka].0, requests[kb].0);
                let why = |other: usize| {
                    vec![format!(
                        "threads swapped with request span #{other}, handled at the same time: together they fit better"
                    )]
                };
                out[ia] = Some(requests[ka].1.on_thread(na, &why(ib)));
                out[ib] = Some(requests[kb].1.on_thread(nb, &why(ia)));
                placed[a].3 = tb;
                placed[b].3 = ta;
                swapped = true;
            }
        }
        if !swapped {
            break;
        }
    }
}

impl<'a> Finder<'a> {
    /// How well thread `tid` fits a request over `[start, end]`; `None` when
    /// it cannot have served it.
    fn fit(
        &self,
        tid: Tid,
        pid: Tid,
        start: u64,
        end: u64,
        thread_name: Option<&str>,
        conn: &Connection,
    ) -> Option<Fit> {
        let th = self.model.thread(tid)?;
        let mut name_matched = false;
        if let Some(want) = thread_name {
            let cut = &want.as_bytes()[..want.len().min(15)];
            // A thread that a pool has just made may serve its first
            // request before any event of the trace shows its new name.
            let mut names = th.names_possible_at(start).peekable();
            if names.peek().is_some() {
                if !names.any(|c| c.as_bytes() == cut) {
                    return None;
                }
                name_matched = true;
            }
        }
        let run_start = self.run_distance(th, start)?;
        let run_end = self.run_distance(th, end)?;
        let receive = self
            .receive_before(th, start, conn)
            .map(|(g, c)| (Gap::on(th, start.saturating_sub(g), start), None, c))
            .or_else(|| self.handed_over(th, pid, start, conn));
        let send = self.send_near(th, start, end, conn);
        Some(Fit {
            tid,
            pid,
            run_start,
            run_end,
            receive,
            send,
            name_matched,
            queued: false,
        })
    }

    /// The receive of a request handed to `th` by another thread of its
    /// process (an acceptor or event loop reading the request, then waking a
    /// pool thread through a queue's condition variable) before `start`:
    /// its gap to the start (receive to wake-up on the waker, plus wake-up
    /// to start on `th`), the thread that handed it over, and the call.
    ///
    /// The wake-ups are walked back from the start (one a little after it:
    /// the clock mapping's error), since `th`'s last socket
    /// send (the previous request's answer: an older hand-off is not this
    /// request's); the first whose waker received data at most
    /// [`HANDOFF_RECEIVE_NS`] before waking it is the hand-off. Wake-ups by
    /// threads that received nothing just before (a lock or an interpreter
    /// lock passed between pool threads) are passed over, as are those
    /// whose waker's receive was on another connection than `conn`.
    fn handed_over(
        &self,
        th: &ThreadHistory,
        pid: Tid,
        start: u64,
        conn: &Connection,
    ) -> Option<(Gap, Option<Tid>, &'static str)> {
        let window_start = start.saturating_sub(IO_WINDOW_NS);
        let since = self
            .last_send(th, window_start, start)
            .unwrap_or(window_start);
        th.states_in(since, start)
            .iter()
            .rev()
            .filter(|s| s.end >= since && s.end <= start + OVERLAP_SLACK_NS)
            .find_map(|s| {
                let ThreadState::Blocked(BlockReason::Thread(w)) = s.state else {
                    return None;
                };
                let waker = self.model.thread(w).filter(|t| t.tid != th.tid)?;
                if pid_of(waker, self.processes) != Some(pid) {
                    return None;
                }
                let (gap, call) = self
                    .receive_before(waker, s.end, conn)
                    .filter(|r| r.0 <= HANDOFF_RECEIVE_NS)?;
                let on_waker = Gap::on(waker, s.end.saturating_sub(gap), s.end);
                let on_th = Gap::on(th, s.end, start);
                let gap = Gap {
                    wall: on_waker.wall + on_th.wall,
                    cpu_wait: on_waker.cpu_wait + on_th.cpu_wait,
                };
                Some((gap, Some(w), call))
            })
    }

    /// Distance from `t` to the nearest interval in which the thread ran
    /// (0 inside one), within [`RUN_LIMIT_NS`] ... else `None`.
    fn run_distance(&self, th: &ThreadHistory, t: u64) -> Option<u64> {
        let states = th.states_in(t.saturating_sub(RUN_LIMIT_NS), t + RUN_LIMIT_NS);
        // States do not overlap: from the first that ends after t, the
        // distance grows forward; before it, backward. The nearest run on
        // each side is the first one met.
        let i = states.partition_point(|s| s.end <= t);
        let running = |s: &&StateInterval| s.state == ThreadState::Running;
        let after = states[i..]
            .iter()
            .find(running)
            .map(|s| s.start.saturating_sub(t));
        let before = states[..i].iter().rev().find(running).map(|s| t - s.end);
        after.into_iter().chain(before).min()
    }

    /// The last receive on `conn` that returned data before `t` (within
    /// the window): its gap to `t` and name. A read counts, dearer (it may
    /// be a file).
    fn receive_before(
        &self,
        th: &ThreadHistory,
        t: u64,
        conn: &Connection,
    ) -> Option<(u64, &'static str)> {
        let calls = th.syscalls_in(t.saturating_sub(IO_WINDOW_NS), t);
        calls
            .iter()
            .rev()
            .filter(|s| s.exit_seen && s.ret > 0 && s.end <= t && conn.admits(s))
            .find_map(|s| match self.io(s) {
                Io::Receive if conn.is_on(s) => {
                    Some((t - s.end, "socket receive on the span's connection"))
                }
                Io::Receive => Some((t - s.end, "socket receive")),
                Io::Read => Some((t - s.end + 1_000, "read")),
                _ => None,
            })
    }

    /// The send on `conn` nearest the end (inside the span or after it),
    /// nearest by the gap's [`Gap::counted`] time.
    fn send_near(
        &self,
        th: &ThreadHistory,
        start: u64,
        end: u64,
        conn: &Connection,
    ) -> Option<(Gap, &'static str)> {
        let calls = th.syscalls_in(start, end + IO_WINDOW_NS);
        // A send after the thread received again past the end belongs to
        // the next exchange: a client receives its answer after the
        // server's span ends, then sends its next request.
        let next_receive = calls
            .iter()
            .filter(|s| s.start >= end && s.exit_seen && s.ret > 0)
            .find(|s| matches!(self.io(s), Io::Receive | Io::Read))
            .map_or(u64::MAX, |s| s.end);
        calls
            .iter()
            // In start order: the scan ends at the next exchange, not at
            // the end of the window.
            .take_while(|s| s.start < next_receive)
            .filter(|s| s.start >= start && conn.admits(s))
            .filter_map(|s| {
                // A write may be to a file or a pipe: dearer by 1 µs.
                let (call, dearer) = match self.io(s) {
                    Io::Send if conn.is_on(s) => ("socket send on the span's connection", 0),
                    Io::Send => ("socket send", 0),
                    Io::Write => ("write", 1_000),
                    _ => return None,
                };
                let gap = Gap::on(th, s.start, end);
                Some((gap.counted() + dearer, gap, call))
            })
            .min_by_key(|x| x.0)
            .map(|(_, gap, call)| (gap, call))
    }
}

/// The process of a thread: the recording's tgid map, else the model's.
fn pid_of(th: &ThreadHistory, processes: &Processes) -> Option<Tid> {
    processes.tgid_of.get(&th.tid).copied().or(th.pid)
}

/// True when `cmdline`'s words include the service name's (split on
/// anything but letters and digits: `my-svc` matches `python my_svc.py`).
fn names_service(cmdline: &str, service: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let want = words(service);
    let have = words(cmdline);
    !want.is_empty() && have.windows(want.len()).any(|w| w == want.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_match_command_line_words() {
        assert!(names_service("python3 -m shop.service front", "front"));
        assert!(names_service(
            "python3 /srv/my_svc.py --port 8080",
            "my-svc"
        ));
        assert!(!names_service("python3 -m shop.service frontend", "front"));
        assert!(!names_service("anything", ""));
    }

    #[test]
    fn children_follow_their_request() {
        let spans = vec![
            PlacementSpan {
                entry: true,
                ..PlacementSpan::default()
            },
            PlacementSpan {
                parent: Some(0),
                ..PlacementSpan::default()
            },
            PlacementSpan {
                parent: Some(1),
                entry: true,
                ..PlacementSpan::default()
            },
            PlacementSpan {
                parent: Some(2),
                ..PlacementSpan::default()
            },
        ];
        assert_eq!(requests_of(&spans), vec![0, 0, 2, 2]);
    }
}

/// What placed requests say about the wall → kernel clock mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffsetBound {
    /// The correction to add to mapped times lies in `[lower_ns, upper_ns]`
    /// (0 inside: the mapping is consistent with the trace).
    pub lower_ns: i64,
    pub upper_ns: i64,
    /// Requests whose windows contain that range, of `of` that gave one.
    pub agreeing: usize,
    pub of: usize,
}

/// Farthest a span's mapped start or end may be from its thread's run for
/// that run to bound the mapping's offset: the mapping is off by µs, never
/// by a run's length.
pub const OFFSET_SEARCH_NS: u64 = 200_000;

/// Bounds the clock mapping's remaining offset with the requests placed on
/// a thread: a span's start and end were taken while its thread ran, and
/// after its request's receive returned, so the correction δ to the mapped
/// times must put the start in the RUNNING interval around it, or nearest
/// it within [`OFFSET_SEARCH_NS`] (after the receive), and the end in the
/// one around or nearest it. Windows of requests placed right overlap on
/// the true correction (0 when the mapping is right). Each request gives such a
/// window of δ; the answer is the range inside the most windows (a few
/// requests may be misplaced, or their runs cut by lost events).
pub fn clock_offset_bound(
    model: &KernelModel,
    arch: Arch,
    spans: &[PlacementSpan],
    placements: &[Option<Placement>],
) -> Option<OffsetBound> {
    let processes = Processes::default();
    let finder = Finder {
        model,
        arch,
        processes: &processes,
        threads_of: BTreeMap::new(),
        answering_on: BTreeMap::new(),
        sends: RefCell::default(),
    };
    let mut windows: Vec<(i64, i64)> = Vec::new();
    for (span, p) in spans.iter().zip(placements) {
        let (Some(p), Some((s, e))) = (p, span.times) else {
            continue;
        };
        let (true, Some(tid)) = (span.entry || span.parent.is_none(), p.tid) else {
            continue;
        };
        let Some(th) = model.thread(tid) else {
            continue;
        };
        // The run around `t`, else the nearest within the search range:
        // a mapping that is off puts the span's times beside its runs.
        let running = |t: u64| {
            th.states_in(t.saturating_sub(OFFSET_SEARCH_NS), t + OFFSET_SEARCH_NS)
                .iter()
                .filter(|st| st.state == ThreadState::Running)
                .min_by_key(|st| {
                    if t < st.start {
                        st.start - t
                    } else {
                        t.saturating_sub(st.end)
                    }
                })
                .map(|st| (st.start as i64 - t as i64, st.end as i64 - t as i64))
        };
        let (Some(a), Some(b)) = (running(s), running(e)) else {
            continue;
        };
        let mut lower = a.0.max(b.0);
        let upper = a.1.min(b.1);
        if let Some((gap, _)) = finder.receive_before(th, s, &Connection::of(span)) {
            // The receive returned `gap` before the mapped start.
            lower = lower.max(-(gap as i64));
        }
        if lower <= upper {
            windows.push((lower, upper));
        }
    }
    // The range covered by the most windows: sweep over their ends.
    let mut ends: Vec<(i64, i32)> = windows.iter().flat_map(|w| [(w.0, 1), (w.1, -1)]).collect();
    // Opening before closing at one point: touching windows share it.
    ends.sort_by_key(|&(x, d)| (x, -d));
    let (mut depth, mut best, mut range) = (0i32, 0i32, None);
    for (k, &(x, d)) in ends.iter().enumerate() {
        depth += d;
        if d > 0 && depth > best {
            best = depth;
            let until = ends[k + 1..].iter().find(|e| e.1 < 0).map_or(x, |e| e.0);
            range = Some((x, until));
        }
    }
    let (lower_ns, upper_ns) = range?;
    Some(OffsetBound {
        lower_ns,
        upper_ns,
        agreeing: best as usize,
        of: windows.len(),
    })
}
