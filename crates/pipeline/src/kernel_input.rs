//! The run's kernel trace as model input: a trace.dat (one stream per CPU,
//! decoded in parallel) or an LTTng CTF folder (each stream decoded on its
//! own thread and merged by time; all streams read as one merged stream
//! when the trace cannot be read per stream, see
//! `deepspan_ctf::CtfTrace::stream_events`).
//!
//! Both give `deepspan_analysis::Input` items in the model's time domain:
//! CLOCK_MONOTONIC ns for trace.dat (`trace_clock=mono`), the CTF clock's
//! absolute ns (offset applied, i.e. close to the Unix epoch) for CTF. Spans
//! imported with a CTF trace carry sync times in that same CTF domain.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use deepspan_analysis::{
    build_model, Arch, HeldBack, Input, KernelModel, LostEvents, PacketDirection, StateBuilder,
};
use deepspan_ctf::CtfTrace;
use deepspan_ftrace::{CpuRecords, Schema, TraceDat};
use deepspan_model::{Tid, Timestamped};

use deepspan_run::{Manifest, Run};

use crate::hosts::HostMap;
use crate::{Error, Progress, Step};

/// A run's kernel trace, opened.
pub enum KernelTrace {
    TraceDat {
        path: PathBuf,
        trace: TraceDat,
        /// What the run's eBPF programs recorded, as model input in time
        /// order: TCP segments (`record --tcp-keys`), and sleeps in system
        /// calls and socket calls for a trace without the system-call
        /// events.
        recorded: Vec<Input>,
        /// The run's recorded throttled switch-outs.
        throttling: Throttling,
    },
    Ctf {
        path: PathBuf,
        trace: CtfTrace,
    },
    /// A merged run (see [`crate::hosts`]): each host's trace.dat, and how
    /// its events enter the one model.
    Hosts {
        /// `hosts.json`.
        path: PathBuf,
        traces: Vec<(PathBuf, TraceDat)>,
        maps: Vec<Arc<HostMap>>,
        /// The host of each CPU of the merged model.
        cpu_hosts: Vec<u32>,
        /// What every host's eBPF programs recorded (see
        /// [`KernelTrace::TraceDat`]), on the merged clock, CPUs and thread
        /// numbers, in time order.
        recorded: Vec<Input>,
        /// Every host's recorded throttled switch-outs on the merged clock
        /// and thread numbers.
        throttling: Throttling,
    },
}

impl KernelTrace {
    /// Opens the run's kernel trace: `kernel/trace.dat`, else the CTF folder
    /// `kernel/ctf/`.
    pub fn open_run(run: &Path) -> Result<KernelTrace, Error> {
        if let Some(file) = crate::hosts::read_hosts(run)? {
            let mut traces = Vec::new();
            let mut cpu_hosts = Vec::new();
            for (h, host) in file.hosts.iter().enumerate() {
                let dat = Run::new(&host.run).trace_dat();
                let trace = TraceDat::open(&dat).map_err(|source| Error::OpenTraceDat {
                    path: dat.clone(),
                    source,
                })?;
                let end = (host.cpu_base + trace.cpus()) as usize;
                if cpu_hosts.len() < end {
                    cpu_hosts.resize(end, h as u32);
                }
                traces.push((dat, trace));
            }
            let maps: Vec<Arc<HostMap>> = HostMap::all(&file).into_iter().map(Arc::new).collect();
            let mut recorded = Vec::new();
            let mut throttling = Throttling {
                switches: Vec::new(),
                complete: true,
            };
            for ((host, map), (_, trace)) in file.hosts.iter().zip(&maps).zip(&traces) {
                recorded.extend(
                    recorded_inputs(&host.run, trace)?
                        .into_iter()
                        .map(|item| map.recorded(item)),
                );
                let host_throttling = read_throttling(&host.run)?;
                // One host without a complete capture: the merged model
                // infers throttling too (see `HeldBack`).
                throttling.complete &= host_throttling.complete;
                throttling.switches.extend(
                    host_throttling
                        .switches
                        .into_iter()
                        .map(|(tid, ts)| map.throttled_switch(tid, ts)),
                );
            }
            recorded.sort_by_key(|s| s.timestamp());
            return Ok(KernelTrace::Hosts {
                path: Run::new(run).hosts(),
                traces,
                maps,
                cpu_hosts,
                recorded,
                throttling,
            });
        }
        let dat = Run::new(run).trace_dat();
        if dat.is_file() {
            return match TraceDat::open(&dat) {
                Ok(trace) => Ok(KernelTrace::TraceDat {
                    recorded: recorded_inputs(run, &trace)?,
                    path: dat,
                    trace,
                    throttling: read_throttling(run)?,
                }),
                Err(source) => Err(Error::OpenTraceDat { path: dat, source }),
            };
        }
        let ctf = Run::new(run).ctf_dir();
        if ctf.is_dir() {
            let trace = match CtfTrace::open(&ctf) {
                Ok(trace) => trace,
                Err(source) => return Err(Error::OpenCtf { path: ctf, source }),
            };
            if !trace.traces().iter().any(|t| t.is_kernel()) {
                let domains = domains(&trace);
                return Err(Error::CtfWithoutKernel { path: ctf, domains });
            }
            return Ok(KernelTrace::Ctf { path: ctf, trace });
        }
        Err(Error::NoKernelTrace {
            run: run.to_path_buf(),
        })
    }

    /// The trace.dat file or the CTF folder.
    pub fn path(&self) -> &Path {
        match self {
            KernelTrace::TraceDat { path, .. }
            | KernelTrace::Ctf { path, .. }
            | KernelTrace::Hosts { path, .. } => path,
        }
    }

    /// Warnings about the input for the analysis notes: what a trace cut
    /// short lost (its whole pages or packets before the cut are decoded).
    /// For CTF the cuts are found while decoding, so this is complete after
    /// [`KernelTrace::build_model`].
    pub fn warnings(&self) -> Vec<String> {
        match self {
            KernelTrace::TraceDat { trace, .. } => trace
                .truncation()
                .map(ToString::to_string)
                .into_iter()
                .collect(),
            KernelTrace::Ctf { trace, .. } => trace
                .truncations()
                .iter()
                .map(ToString::to_string)
                .collect(),
            KernelTrace::Hosts { traces, .. } => traces
                .iter()
                .filter_map(|(path, t)| Some(format!("{}: {}", path.display(), t.truncation()?)))
                .collect(),
        }
    }

    /// The system call table to name numbered system calls with (CTF
    /// events name theirs).
    pub fn arch(&self) -> Arch {
        match self {
            KernelTrace::TraceDat { trace, .. } => Arch::from_uname(trace.uname().unwrap_or("")),
            KernelTrace::Ctf { .. } => Arch::from_uname(""),
            KernelTrace::Hosts { traces, .. } => {
                Arch::from_uname(traces[0].1.uname().unwrap_or(""))
            }
        }
    }

    /// Decodes the trace into `builder`, telling `progress` how far it got
    /// ([`Step::DecodeTraceDat`] in bytes, [`Step::DecodeCtf`] in events).
    /// What a trace cut short lost is in [`KernelTrace::warnings`]
    /// afterwards.
    pub fn build_model(
        &self,
        builder: StateBuilder,
        progress: &dyn Progress,
    ) -> Result<(KernelModel, LostEvents), Error> {
        match self {
            KernelTrace::TraceDat {
                path,
                trace,
                recorded,
                throttling,
            } => {
                let total = trace.cpu_data_bytes();
                let step = Step::DecodeTraceDat;
                progress.begin(step, Some(total));
                let read = Arc::new(AtomicU64::new(0));
                let streams = (0..trace.cpus())
                    .map(|cpu| {
                        Ok(WithRecorded::Trace(CpuStream::new(
                            trace.cpu_records(cpu)?,
                            trace.schema().clone(),
                            read.clone(),
                        )))
                    })
                    .collect::<Result<Vec<_>, deepspan_ftrace::Error>>();
                let streams = match streams {
                    Ok(mut streams) => {
                        streams.push(WithRecorded::Recorded(recorded.clone().into_iter()));
                        streams
                    }
                    Err(source) => {
                        progress.end(step);
                        let path = path.clone();
                        return Err(Error::OpenTraceDat { path, source });
                    }
                };
                let built = build_model(builder, streams, &mut |_| {
                    progress.advance(step, read.load(Ordering::Relaxed).min(total));
                })
                .map_err(|source| Error::DecodeTraceDat {
                    path: path.clone(),
                    source,
                });
                progress.end(step);
                built.map(|built| with_throttling(built, throttling))
            }
            KernelTrace::Hosts {
                traces,
                maps,
                cpu_hosts,
                recorded,
                throttling,
                ..
            } => {
                let total = traces.iter().map(|(_, t)| t.cpu_data_bytes()).sum();
                let step = Step::DecodeTraceDat;
                progress.begin(step, Some(total));
                let read = Arc::new(AtomicU64::new(0));
                let mut streams = Vec::new();
                for (h, ((path, trace), map)) in traces.iter().zip(maps).enumerate() {
                    for cpu in 0..trace.cpus() {
                        let records = trace.cpu_records(cpu).map_err(|source| {
                            progress.end(step);
                            Error::OpenTraceDat {
                                path: path.clone(),
                                source,
                            }
                        })?;
                        streams.push(WithRecorded::Trace(HostStream {
                            host: h,
                            cpu: CpuStream::new(records, trace.schema().clone(), read.clone()),
                            map: map.clone(),
                        }));
                    }
                }
                streams.push(WithRecorded::Recorded(recorded.clone().into_iter()));
                let builder = builder.hosts(cpu_hosts.clone());
                let built = build_model(builder, streams, &mut |_| {
                    progress.advance(step, read.load(Ordering::Relaxed).min(total));
                })
                .map_err(|(h, source)| Error::DecodeTraceDat {
                    path: traces[h].0.clone(),
                    source,
                });
                progress.end(step);
                built.map(|built| with_throttling(built, throttling))
            }
            KernelTrace::Ctf { path, trace } => {
                let step = Step::DecodeCtf;
                progress.begin(step, None);
                let mut progress_events = |n| progress.advance(step, n);
                let kernel: Arc<[bool]> = trace.traces().iter().map(|t| t.is_kernel()).collect();
                let claimed = Arc::new(AtomicUsize::new(0));
                let built = match trace.stream_events() {
                    Some(readers) => {
                        let streams = readers.into_iter().map(|r| {
                            let lost = r.lost_log();
                            CtfInput::new((r, lost), &kernel, &claimed)
                        });
                        build_model(builder, streams.collect(), &mut progress_events)
                    }
                    None => {
                        let events = trace.events();
                        let lost = events.lost_log();
                        let input = CtfInput::new((events, lost), &kernel, &claimed);
                        build_model(builder, vec![input], &mut progress_events)
                    }
                }
                .map_err(|source| Error::DecodeCtf {
                    path: path.clone(),
                    source,
                });
                progress.end(step);
                built
            }
        }
    }
}

fn domains(trace: &CtfTrace) -> String {
    let names: Vec<&str> = trace
        .traces()
        .iter()
        .map(|t| t.domain().unwrap_or("unknown domain"))
        .collect();
    names.join(", ")
}

/// A kernel trace's streams, and what the run's eBPF programs recorded as
/// one more (the model takes them in time order with the events).
enum WithRecorded<S> {
    Trace(S),
    Recorded(std::vec::IntoIter<Input>),
}

impl<S, E> Iterator for WithRecorded<S>
where
    S: Iterator<Item = Result<Input, E>>,
{
    type Item = Result<Input, E>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            WithRecorded::Trace(stream) => stream.next(),
            WithRecorded::Recorded(recorded) => recorded.next().map(Ok),
        }
    }
}

/// The records of one eBPF capture file of a run, read by `read` (none
/// when the recorder saved no such file, or could not record it); a file
/// that does not read is the error `error` makes of its path and why.
fn read_capture<T, E: std::fmt::Display>(
    path: PathBuf,
    read: fn(&Path) -> Result<Vec<T>, E>,
    error: fn(PathBuf, String) -> Error,
) -> Result<Vec<T>, Error> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    read(&path).map_err(|e| error(path.clone(), e.to_string()))
}

/// The throttled switch-outs the recorder saw in a run.
pub struct Throttling {
    /// (tid, time) of each.
    pub switches: Vec<(Tid, u64)>,
    /// The capture ran for the whole run and lost no record: a wait it
    /// does not cover was not throttled.
    pub complete: bool,
}

/// The throttled switch-outs the recorder saw in `run`. The capture is
/// complete when its file exists (the recorder creates it when the
/// program attaches, even if nothing is throttled) and the manifest counts
/// no record lost to the ring.
fn read_throttling(run: &Path) -> Result<Throttling, Error> {
    let path = Run::new(run).cfs_throttle();
    let recorded = path.is_file();
    let switches = read_capture(
        path,
        deepspan_record::read_throttled_switches,
        |path, reason| Error::ThrottledSwitches { path, reason },
    )?;
    // A run without a manifest (copied by hand) is judged by its file.
    let lost = Manifest::load(run)
        .ok()
        .and_then(|m| m.cfs_throttle)
        .map_or(0, |t| t.lost);
    Ok(Throttling {
        switches: switches.into_iter().map(|s| (s.tid, s.mono_ns)).collect(),
        complete: recorded && lost == 0,
    })
}

/// A built model with the recorded throttling in it.
fn with_throttling(
    (mut model, lost): (KernelModel, LostEvents),
    throttling: &Throttling,
) -> (KernelModel, LostEvents) {
    if throttling.complete || !throttling.switches.is_empty() {
        let held = HeldBack::from_switches(throttling.switches.iter().copied(), &model);
        model.set_held_back(if throttling.complete {
            held
        } else {
            held.with_gaps()
        });
    }
    (model, lost)
}

/// What a run's eBPF programs recorded, as model input in time order: its
/// TCP segments (`record --tcp-keys`), its switches out of idle, and its
/// sleeps in system calls and socket calls when `trace` lacks the
/// system-call events.
fn recorded_inputs(run: &Path, trace: &TraceDat) -> Result<Vec<Input>, Error> {
    let files = Run::new(run);
    let mut inputs: Vec<Input> = read_capture(
        files.tcp_segments(),
        deepspan_record::read_tcp_segments,
        |path, reason| Error::TcpSegments { path, reason },
    )?
    .iter()
    .map(segment_input)
    .collect();
    let idle = read_capture(
        files.idle_switches(),
        deepspan_record::read_idle_switches,
        |path, reason| Error::IdleSwitches { path, reason },
    )?;
    inputs.extend(idle.iter().map(|s| Input::IdleSwitch {
        cpu: s.cpu,
        ts: s.mono_ns,
        tid: s.tid,
    }));
    if !has_syscall_events(trace.schema()) {
        let sleeps = read_capture(
            files.blocked_syscalls(),
            deepspan_record::read_blocked_syscalls,
            |path, reason| Error::BlockedSyscalls { path, reason },
        )?;
        inputs.extend(sleeps.iter().map(blocked_syscall_input));
        let calls = read_capture(
            files.socket_calls(),
            deepspan_record::read_socket_calls,
            |path, reason| Error::SocketCalls { path, reason },
        )?;
        inputs.extend(calls.iter().map(socket_call_input));
    }
    inputs.sort_by_key(|s| s.timestamp());
    Ok(inputs)
}

/// Whether a trace.dat holds system-call events (its formats are those of
/// the recorded events only): the model then has each call from its entry
/// to its exit, and the recorder's sleeps in calls would only repeat part
/// of it.
fn has_syscall_events(schema: &Schema) -> bool {
    schema
        .events()
        .any(|e| e.system == "raw_syscalls" || e.system == "syscalls")
}

/// A recorded socket call as model input.
fn socket_call_input(call: &deepspan_record::SocketCall) -> Input {
    Input::SocketCall {
        ts: call.mono_ns,
        tid: call.tid,
        sent: call.sent,
        bytes: call.bytes,
        socket: call.socket,
    }
}

/// A recorded sleep in a system call as model input.
fn blocked_syscall_input(call: &deepspan_record::BlockedSyscall) -> Input {
    Input::BlockedSyscall {
        ts: call.mono_ns,
        tid: call.tid,
        nr: call.nr,
        args: call.args,
        read_chars: call.read_chars,
    }
}

/// A recorded segment as model input: keyed by what both ends see.
fn segment_input(s: &deepspan_record::TcpSegment) -> Input {
    Input::Segment {
        cpu: s.cpu,
        ts: s.mono_ns,
        tid: s.tid,
        key: segment_key(s.seq, s.ack_seq, s.flags),
        direction: if s.sent {
            PacketDirection::Sent
        } else {
            PacketDirection::Received
        },
    }
}

/// A 64-bit digest of a TCP segment's (seq, ack_seq, flags).
fn segment_key(seq: u32, ack_seq: u32, flags: u8) -> u64 {
    let both = (u64::from(seq) << 32) | u64::from(ack_seq);
    (both ^ (u64::from(flags) << 56)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// One CPU of one host of a merged run, as the merged model takes it.
struct HostStream {
    host: usize,
    cpu: CpuStream,
    map: Arc<HostMap>,
}

impl Iterator for HostStream {
    type Item = Result<Input, (usize, deepspan_ftrace::Error)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.cpu.next()? {
                Ok(item) => {
                    if let Some(item) = self.map.input(item) {
                        return Some(Ok(item));
                    }
                }
                Err(e) => return Some(Err((self.host, e))),
            }
        }
    }
}

/// One CPU's records as model input, with the reader's lost-event reports
/// turned into markers at the first record after the loss.
struct CpuStream {
    records: CpuRecords,
    schema: Arc<Schema>,
    lost: u64,
    last_ts: u64,
    /// The event to hand out after the lost-event marker that precedes it.
    pending: Option<deepspan_model::Event>,
    /// Bytes of CPU data read, shared with the progress display.
    read: Arc<AtomicU64>,
    /// This stream's part of `read` so far.
    published: u64,
    /// Events left until the next progress update.
    until_progress: u32,
}

/// Events between progress updates: the shared counter is then not a hot
/// spot, and at the file's densest (about 40 bytes an event) a step is
/// still well under a MiB.
const PROGRESS_EVERY: u32 = 16_384;

impl CpuStream {
    fn new(records: CpuRecords, schema: Arc<Schema>, read: Arc<AtomicU64>) -> CpuStream {
        CpuStream {
            records,
            schema,
            lost: 0,
            last_ts: 0,
            pending: None,
            read,
            published: 0,
            until_progress: PROGRESS_EVERY,
        }
    }

    fn publish_progress(&mut self) {
        let now = self.records.bytes_read();
        self.read.fetch_add(now - self.published, Ordering::Relaxed);
        self.published = now;
    }
}

impl Iterator for CpuStream {
    type Item = Result<Input, deepspan_ftrace::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending.take() {
            return Some(Ok(Input::Event(e)));
        }
        // Decoded in place (no per-record `Record` sharing the chunk).
        let next = self
            .records
            .next_ref()
            .map(|r| r.map(|r| r.to_event(&self.schema)));
        let lost = self.records.lost_events();
        let cpu = self.records.cpu();
        match next {
            Some(Ok(e)) => {
                self.until_progress -= 1;
                if self.until_progress == 0 {
                    self.until_progress = PROGRESS_EVERY;
                    self.publish_progress();
                }
                self.last_ts = e.ts;
                if lost > self.lost {
                    let count = lost - self.lost;
                    self.lost = lost;
                    let ts = e.ts;
                    self.pending = Some(e);
                    return Some(Ok(Input::Lost { cpu, ts, count }));
                }
                Some(Ok(Input::Event(e)))
            }
            Some(Err(e)) => Some(Err(e)),
            None if lost > self.lost => {
                // Lost after the last record we have.
                let count = lost - self.lost;
                self.lost = lost;
                Some(Ok(Input::Lost {
                    cpu,
                    ts: self.last_ts,
                    count,
                }))
            }
            None => {
                self.publish_progress();
                None
            }
        }
    }
}

/// CTF events as model input: one stream of a folder (see
/// [`deepspan_ctf::CtfTrace::stream_events`]) decoded on its own thread, or
/// all of them merged when the trace cannot be read per stream. Only kernel
/// traces' events are kept. The loss reports of all streams sit in one
/// shared log, looked at every [`LOSS_CHECK_EVERY`] events (it is behind a
/// lock): each report becomes a marker once, in the input that claims it
/// first, at that input's current time.
struct CtfInput<I> {
    reader: I,
    lost: deepspan_ctf::LostLogHandle,
    kernel: Arc<[bool]>,
    /// Reports of the shared log already turned into markers.
    claimed: Arc<AtomicUsize>,
    /// Items to hand out before reading on, popped from the back.
    pending: Vec<Input>,
    read: u64,
    last_ts: u64,
    done: bool,
}

const LOSS_CHECK_EVERY: u64 = 256;

impl<I> CtfInput<I> {
    fn new(
        (reader, lost): (I, deepspan_ctf::LostLogHandle),
        kernel: &Arc<[bool]>,
        claimed: &Arc<AtomicUsize>,
    ) -> CtfInput<I> {
        CtfInput {
            reader,
            lost,
            kernel: kernel.clone(),
            claimed: claimed.clone(),
            pending: Vec::new(),
            read: 0,
            last_ts: 0,
            done: false,
        }
    }

    fn claim_losses(&mut self) {
        let reports = self.lost.reports();
        let from = self.claimed.load(Ordering::Acquire);
        if reports <= from
            || self
                .claimed
                .compare_exchange(from, reports, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        for r in self.lost.records().get(from..reports).unwrap_or_default() {
            if self.kernel.get(r.trace).copied().unwrap_or(false) {
                self.pending.push(Input::Lost {
                    cpu: r.stream_instance.unwrap_or(0) as u32,
                    ts: self.last_ts,
                    count: r.count,
                });
            }
        }
    }
}

impl<I> Iterator for CtfInput<I>
where
    I: Iterator<Item = Result<deepspan_ctf::CtfEvent, deepspan_ctf::Error>>,
{
    type Item = Result<Input, deepspan_ctf::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(i) = self.pending.pop() {
                return Some(Ok(i));
            }
            if self.done {
                return None;
            }
            self.read += 1;
            let event = match self.reader.next() {
                None => {
                    self.done = true;
                    self.claim_losses();
                    continue;
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Some(Ok(e)) => e,
            };
            if self
                .kernel
                .get(event.trace_index())
                .copied()
                .unwrap_or(false)
            {
                self.last_ts = event.ts();
                self.pending.push(Input::Event(event.to_event()));
            }
            if self.read.is_multiple_of(LOSS_CHECK_EVERY) {
                // Markers are pushed above the event they were noticed at,
                // so they come out before it.
                self.claim_losses();
            }
        }
    }
}
