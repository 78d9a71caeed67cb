//! Several hosts' runs analysed as one: a *merged run* folder whose
//! `hosts.json` names each host's run and the transform of its clock onto
//! the reference host's (from `deepspan sync`'s alignment).
//!
//! [`merge_runs`] writes the folder: `hosts.json`, a manifest (the
//! reference's, with the merged process tables), `spans/` (every host's
//! spans, their monotonic times on the reference clock, their wall times
//! on the reference's wall clock, their thread ids numbered per host) and
//! `kernel/saved_tgids`. [`crate::analyze_run`] then reads each host's
//! `kernel/trace.dat` through [`HostClock`]: times through the transform,
//! CPUs numbered after the previous hosts', thread ids as
//! [`deepspan_analysis::host_tid`] numbers them. So every table, report and
//! view of a single run works on a merged one, and a thread's host is the
//! high bits of its id.
//!
//! Hosts that share a kernel (network namespaces, one run per namespace
//! recorded with `--pid`): each run also holds events of the other's
//! threads, as ftrace's pid filter keeps a wake-up or a switch when either
//! thread is traced. A thread of another run's processes is numbered as
//! that host's; a wake-up of it, or its fork, is left to its own run; a
//! switch to or from it reads as the CPU leaving this host's threads; a
//! wake-up of this host's thread in its context is a packet it sent (see
//! `StateBuilder::hosts`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deepspan_analysis::{host_tid, Input, MAX_HOSTS};
use deepspan_model::{human, Event, EventKind, Tid};
use deepspan_spans::model::{
    Value, ATTR_MONO_END, ATTR_MONO_NS, ATTR_MONO_START, ATTR_PID_NS, ATTR_TID, EVENT_OFF, EVENT_ON,
};
use deepspan_spans::{ClockMap, Span, SpanWriter};

use deepspan_run::{layout, Manifest, Run};

use crate::Error;

pub use deepspan_run::{HostEntry, HostsFile};

/// A host's clock on the reference's, as the caller aligned it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostClock {
    pub slope: f64,
    pub offset_ns: f64,
    /// `deepspan_sync::Quality::name`.
    pub quality: &'static str,
    pub matched: u64,
    /// The most a mapped time of the host's run can be off, in ns, when
    /// the messages bound it ([`HostEntry::max_error_ns`]).
    pub max_error_ns: Option<f64>,
}

impl HostClock {
    /// The time `t` of this host on the reference clock, in ns (the
    /// product computed as `t + (slope − 1)·t` to keep the last digits).
    pub fn map_ns(&self, t: u64) -> u64 {
        let shift = (self.slope - 1.0) * t as f64 + self.offset_ns;
        (t as i128 + shift.round() as i128).max(0) as u64
    }
}

/// What [`merge_runs`] wrote.
#[derive(Debug)]
pub struct Merged {
    pub hosts: HostsFile,
    /// Spans written, per host.
    pub spans: Vec<usize>,
    pub notes: Vec<String>,
}

/// Writes the merged run folder `out` (new, or empty) of `runs`, one per
/// host, whose clocks `clocks[i]` map onto host `reference`'s.
pub fn merge_runs(
    runs: &[PathBuf],
    clocks: &[HostClock],
    reference: usize,
    out: &Path,
) -> Result<Merged, Error> {
    assert_eq!(runs.len(), clocks.len(), "one clock per run");
    let bad = |path: &Path, reason: String| Error::Hosts {
        path: path.to_path_buf(),
        reason,
    };
    if runs.len() < 2 {
        return Err(bad(out, "a merged analysis needs two runs or more".into()));
    }
    if runs.len() > MAX_HOSTS {
        return Err(bad(out, format!("at most {MAX_HOSTS} hosts")));
    }
    if out.exists() && out.read_dir().map_or(true, |mut d| d.next().is_some()) {
        return Err(bad(
            out,
            "exists and is not an empty folder: give a new folder for the merged run".into(),
        ));
    }
    let mut hosts = Vec::new();
    let mut manifests = Vec::new();
    let mut cpu_base = 0u32;
    for (run, clock) in runs.iter().zip(clocks) {
        let run = std::fs::canonicalize(run)
            .map_err(|e| bad(run, format!("cannot open the run folder: {e}")))?;
        let files = Run::new(&run);
        if !files.trace_dat().is_file() {
            return Err(bad(
                &run,
                "no kernel/trace.dat: a merged analysis reads runs recorded with `deepspan record` (CTF runs are not supported yet)".into(),
            ));
        }
        let manifest = Manifest::load(&run).map_err(|e| Error::Hosts {
            path: files.manifest(),
            reason: e.to_string(),
        })?;
        let trace_cpus = deepspan_ftrace::TraceDat::open(&files.trace_dat())
            .map_err(|source| Error::OpenTraceDat {
                path: files.trace_dat(),
                source,
            })?
            .cpus() as u32;
        let cpus = (manifest.cpus as u32).max(trace_cpus);
        hosts.push(HostEntry {
            host: match manifest.host.as_str() {
                "" => "unknown".to_string(),
                host => host.to_string(),
            },
            run: run.clone(),
            slope: clock.slope,
            offset_ns: clock.offset_ns,
            quality: clock.quality.to_string(),
            matched: clock.matched,
            max_error_ns: clock.max_error_ns,
            cpu_base,
            cpus,
            boot_id: manifest.boot_id.clone(),
            pids: manifest.pids.clone(),
        });
        cpu_base += cpus;
        manifests.push(manifest);
    }
    let file = HostsFile { reference, hosts };
    let merged = Run::new(out);
    std::fs::create_dir_all(merged.kernel_dir()).map_err(|source| Error::Write {
        path: out.to_path_buf(),
        source,
    })?;
    let write = |path: PathBuf, bytes: Vec<u8>| {
        std::fs::write(&path, bytes).map_err(|source| Error::Write { path, source })
    };
    file.save(out).map_err(|source| Error::Write {
        path: merged.hosts(),
        source,
    })?;

    // The process tables, every id numbered by host.
    let mut tgids = String::new();
    let mut scans = Vec::new();
    let mut recorder_tids = Vec::new();
    let mut notes = Vec::new();
    for (h, (entry, manifest)) in file.hosts.iter().zip(&manifests).enumerate() {
        let h = h as u32;
        for (tid, tgid) in crate::inputs::read_tgids(&entry.run) {
            tgids.push_str(&format!("{} {}\n", host_tid(h, tid), host_tid(h, tgid)));
        }
        for mut p in read_scan(&entry.run, &mut notes) {
            p.pid = host_tid(h, p.pid);
            p.pid_ns = p.pid_ns.map(|ns| host_pid_ns(h, ns));
            for host in p.namespaced_tids.values_mut() {
                *host = host_tid(h, *host as Tid) as u32;
            }
            scans.push(p);
        }
        recorder_tids.extend(manifest.recorder_tids.iter().map(|&t| host_tid(h, t)));
    }
    write(merged.saved_tgids(), tgids.into_bytes())?;
    write(
        merged.processes(),
        serde_json::to_vec(&scans).expect("plain data"),
    )?;

    // The reference's manifest, for its clock samples: the merged spans'
    // wall times are on its wall clock.
    let mut manifest = manifests[reference].clone();
    let names: Vec<&str> = file.hosts.iter().map(|h| h.host.as_str()).collect();
    manifest.host = names.join("+");
    manifest.cpus = cpu_base as usize;
    manifest.pids = Vec::new();
    manifest.recorder_tids = recorder_tids;
    manifest.tgids = Some(layout::SAVED_TGIDS.into());
    manifest.processes = Some(layout::PROCESSES.into());
    manifest.kernel_trace = None;
    manifest.hosts = Some(layout::HOSTS.into());
    manifest.save(out).map_err(|e| match e {
        deepspan_run::ManifestError::Write { path, source } => Error::Write { path, source },
        read => Error::Hosts {
            path: merged.manifest(),
            reason: read.to_string(),
        },
    })?;

    let reference_clock = ClockMap::from_manifest(&file.hosts[reference].run).ok();
    let mut writer = SpanWriter::create(out).map_err(|source| Error::Spans {
        run: out.to_path_buf(),
        source,
    })?;
    let mut counts = Vec::new();
    for (h, entry) in file.hosts.iter().enumerate() {
        let mut spans = crate::inputs::read_spans(&entry.run, &mut notes)?;
        let host_clock = ClockMap::from_manifest(&entry.run).ok();
        let clock = clocks[h];
        for s in &mut spans {
            to_reference(
                s,
                h as u32,
                &clock,
                host_clock.as_ref(),
                reference_clock.as_ref(),
            );
        }
        for chunk in spans.chunks(1024) {
            writer.append(chunk).map_err(|source| Error::Spans {
                run: out.to_path_buf(),
                source,
            })?;
        }
        counts.push(spans.len());
    }
    writer.flush().map_err(|source| Error::Spans {
        run: out.to_path_buf(),
        source,
    })?;
    Ok(Merged {
        hosts: file,
        spans: counts,
        notes,
    })
}

fn read_scan(run: &Path, notes: &mut Vec<String>) -> Vec<deepspan_record::ProcessEntry> {
    let path = Run::new(run).processes();
    let Ok(text) = std::fs::read(&path) else {
        return Vec::new();
    };
    serde_json::from_slice(&text).unwrap_or_else(|e| {
        notes.push(format!(
            "{}: {e}; the process scan is not used",
            path.display()
        ));
        Vec::new()
    })
}

/// PID namespace `ns` of host `h`, as the merged run numbers it: two hosts
/// may have namespaces of the same inode number. Host 0's are its own.
fn host_pid_ns(h: u32, ns: u64) -> u64 {
    u64::from(h) << 32 | ns
}

/// Moves span `s` of host `h` onto the reference: its deepspan monotonic
/// times through the host's clock, its thread ids numbered by host (or its
/// PID namespace, when its ids are a container's, which the analysis maps
/// through the merged scan), its wall times onto the reference's wall
/// clock (through the host's clock samples, the transform, and the
/// reference's samples back), so that the merged run's one clock map
/// places spans without deepspan fields too.
fn to_reference(
    s: &mut Span,
    h: u32,
    clock: &HostClock,
    host_samples: Option<&ClockMap>,
    reference_samples: Option<&ClockMap>,
) {
    let int = |v: u64| Value::Int(v.min(i64::MAX as u64) as i64);
    let namespaced = s.sync.pid_ns.is_some();
    let tid = |t: i64| {
        if namespaced {
            t
        } else {
            host_tid(h, t as Tid).into()
        }
    };
    if let Some(ns) = s.sync.pid_ns {
        s.attributes.insert(ATTR_PID_NS, int(host_pid_ns(h, ns)));
    }
    if let Some(t) = s.sync.tid {
        s.attributes.insert(ATTR_TID, int(tid(t.into()) as u64));
    }
    for (key, t) in [
        (ATTR_MONO_START, s.sync.mono_start_ns),
        (ATTR_MONO_END, s.sync.mono_end_ns),
    ] {
        if let Some(t) = t {
            s.attributes.insert(key, int(clock.map_ns(t)));
        }
    }
    for ev in &mut s.events {
        if ev.name != EVENT_ON && ev.name != EVENT_OFF {
            continue;
        }
        if let Some(t) = ev.attributes.get(ATTR_TID).and_then(|v| v.as_i64()) {
            ev.attributes.insert(ATTR_TID, int(tid(t) as u64));
        }
        let mono = ev.attributes.get(ATTR_MONO_NS).and_then(|v| v.as_i64());
        if let Some(t) = mono {
            ev.attributes
                .insert(ATTR_MONO_NS, int(clock.map_ns(t.max(0) as u64)));
        }
    }
    if let (Some(host), Some(reference)) = (host_samples, reference_samples) {
        let wall = |w: u64| reference.mono_to_wall(clock.map_ns(host.wall_to_mono(w)));
        let (start, end) = (wall(s.start_ns), wall(s.end_ns));
        s.start_ns = start;
        s.end_ns = end.max(start);
        for ev in &mut s.events {
            ev.time_ns = wall(ev.time_ns);
        }
    }
    s.refresh_sync();
}

/// The threads a run was limited to (`record --pid`): the listed processes'
/// threads, by the run's saved tgids.
#[derive(Debug, Default)]
struct Traced {
    pids: HashSet<Tid>,
    tgid_of: HashMap<Tid, Tid>,
}

impl Traced {
    fn holds(&self, tid: Tid) -> bool {
        self.pids.contains(&tid)
            || self
                .tgid_of
                .get(&tid)
                .is_some_and(|g| self.pids.contains(g))
    }
}

/// How one host's events enter the merged model (see the module's doc).
#[derive(Debug)]
pub struct HostMap {
    number: u32,
    clock: HostClock,
    cpu_base: u32,
    /// For a pid-limited run sharing its kernel with other hosts' runs:
    /// this run's traced threads, and the others' (by host number).
    shared_kernel: Option<SharedKernel>,
}

/// A run's own traced threads, and those of the other runs on its kernel
/// (by host number).
type SharedKernel = (Arc<Traced>, Vec<(u32, Arc<Traced>)>);

/// Whose thread a tid of a run sharing its kernel is.
enum Owner {
    /// This host's, or no host's traced processes (a kernel thread, a
    /// process no run was limited to): numbered as this host's.
    Here,
    /// Another host's traced thread.
    Other(u32),
}

impl HostMap {
    /// Each host's map, from a merged run's `hosts.json`.
    pub(crate) fn all(file: &HostsFile) -> Vec<HostMap> {
        let traced: Vec<Option<Arc<Traced>>> = file
            .hosts
            .iter()
            .map(|h| {
                (!h.pids.is_empty() && h.boot_id.is_some()).then(|| {
                    Arc::new(Traced {
                        pids: h.pids.iter().copied().collect(),
                        tgid_of: crate::inputs::read_tgids(&h.run),
                    })
                })
            })
            .collect();
        file.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let shared_kernel = traced[i].as_ref().and_then(|mine| {
                    let others: Vec<(u32, Arc<Traced>)> = file
                        .hosts
                        .iter()
                        .enumerate()
                        .filter(|&(j, o)| j != i && o.boot_id == h.boot_id)
                        .filter_map(|(j, _)| Some((j as u32, traced[j].clone()?)))
                        .collect();
                    (!others.is_empty()).then(|| (mine.clone(), others))
                });
                HostMap {
                    number: i as u32,
                    clock: HostClock {
                        slope: h.slope,
                        offset_ns: h.offset_ns,
                        quality: "",
                        matched: h.matched,
                        max_error_ns: h.max_error_ns,
                    },
                    cpu_base: h.cpu_base,
                    shared_kernel,
                }
            })
            .collect()
    }

    fn owner(&self, tid: Tid) -> Owner {
        let Some((mine, others)) = &self.shared_kernel else {
            return Owner::Here;
        };
        if tid <= 0 || mine.holds(tid) {
            return Owner::Here;
        }
        match others.iter().find(|(_, t)| t.holds(tid)) {
            Some(&(h, _)) => Owner::Other(h),
            None => Owner::Here,
        }
    }

    fn number(&self, tid: Tid) -> Tid {
        match self.owner(tid) {
            Owner::Here => host_tid(self.number, tid),
            Owner::Other(h) => host_tid(h, tid),
        }
    }

    fn is_other(&self, tid: Tid) -> bool {
        matches!(self.owner(tid), Owner::Other(_))
    }

    /// The event as the merged model takes it, or None when another
    /// host's run holds it.
    fn event(&self, mut e: Event) -> Option<Event> {
        if self.shared_kernel.is_some() {
            match &mut e.kind {
                EventKind::SchedWaking(w)
                | EventKind::SchedWakeup(w)
                | EventKind::SchedWakeupNew(w)
                    if self.is_other(w.tid) =>
                {
                    return None
                }
                EventKind::SchedProcessFork { parent_tid, .. } if self.is_other(*parent_tid) => {
                    return None
                }
                EventKind::SchedSwitch(s) => {
                    for tid in [&mut s.prev_tid, &mut s.next_tid] {
                        if self.is_other(*tid) {
                            *tid = 0;
                        }
                    }
                    if s.prev_tid == 0 && s.next_tid == 0 {
                        return None;
                    }
                }
                _ => {}
            }
        }
        e.map_tids(|t| self.number(t));
        e.ts = self.clock.map_ns(e.ts);
        e.cpu += self.cpu_base;
        Some(e)
    }

    /// An item this host's eBPF programs recorded (a TCP segment, a sleep
    /// in a system call, a socket call, a switch out of idle), as the merged model takes it. The
    /// trace's own items go through [`HostMap::input`].
    pub(crate) fn recorded(&self, mut item: Input) -> Input {
        match &mut item {
            Input::Segment { cpu, ts, tid, .. } | Input::IdleSwitch { cpu, ts, tid } => {
                *cpu += self.cpu_base;
                *ts = self.clock.map_ns(*ts);
                *tid = self.number(*tid);
            }
            Input::BlockedSyscall { ts, tid, .. } | Input::SocketCall { ts, tid, .. } => {
                *ts = self.clock.map_ns(*ts);
                *tid = self.number(*tid);
            }
            Input::Event(_) | Input::Lost { .. } => {}
        }
        item
    }

    /// A throttled switch-out this host's run recorded, as the merged
    /// model takes it.
    pub(crate) fn throttled_switch(&self, tid: Tid, ts: u64) -> (Tid, u64) {
        (self.number(tid), self.clock.map_ns(ts))
    }

    /// A decoded item of this host's trace, as the merged model takes it.
    pub(crate) fn input(&self, item: Input) -> Option<Input> {
        match item {
            Input::Event(e) => self.event(e).map(Input::Event),
            Input::Lost { cpu, ts, count } => Some(Input::Lost {
                cpu: cpu + self.cpu_base,
                ts: self.clock.map_ns(ts),
                count,
            }),
            Input::Segment { .. }
            | Input::BlockedSyscall { .. }
            | Input::SocketCall { .. }
            | Input::IdleSwitch { .. } => Some(item),
        }
    }
}

/// The calls between hosts of a merged run's spans: each CLIENT span and
/// its SERVER child on another host, both placed by deepspan's fields.
pub(crate) fn remote_calls(spans: &[Span]) -> Vec<deepspan_analysis::RemoteCall> {
    let clients: HashMap<(deepspan_spans::TraceId, deepspan_spans::SpanId), (Tid, u64)> = spans
        .iter()
        .filter(|s| s.kind == deepspan_spans::SpanKind::Client)
        .filter_map(|s| {
            let tid = Tid::try_from(s.sync.tid?).ok()?;
            Some(((s.trace_id, s.span_id), (tid, s.sync.mono_end_ns?)))
        })
        .collect();
    spans
        .iter()
        .filter(|s| s.kind == deepspan_spans::SpanKind::Server)
        .filter_map(|s| {
            let &(client_tid, client_end) = clients.get(&(s.trace_id, s.parent_span_id?))?;
            let server_tid = Tid::try_from(s.sync.tid?).ok()?;
            let other_host = deepspan_analysis::split_host_tid(client_tid).0
                != deepspan_analysis::split_host_tid(server_tid).0;
            other_host.then_some(deepspan_analysis::RemoteCall {
                client_tid,
                server_tid,
                server_end: s.sync.mono_end_ns?,
                client_end,
            })
        })
        .collect()
}

/// Reads a merged run's `hosts.json`, if `run` is one.
pub fn read_hosts(run: &Path) -> Result<Option<HostsFile>, Error> {
    HostsFile::load(run).map_err(|e| Error::Hosts {
        path: e.path,
        reason: e.reason,
    })
}

/// The notes of a merged analysis: each host's clock and how far it can be
/// trusted.
pub(crate) fn alignment_notes(file: &HostsFile) -> Vec<String> {
    file.hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let threads = match i {
                0 => "threads by their tid".to_string(),
                _ => format!("threads h{i}:TID"),
            };
            if i == file.reference {
                return format!("host {} ({threads}): the reference clock", h.host);
            }
            let bound = match h.max_error_ns {
                Some(ns) => format!("; its times are off by at most {}", human::duration(ns as u64)),
                None => String::new(),
            };
            format!(
                "host {} ({threads}): clock aligned {} ({} messages matched): t × {:.9} {:+.0} ns{bound}",
                h.host, h.quality, h.matched, h.slope, h.offset_ns
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepspan_spans::model::{Attributes, Event};
    use deepspan_spans::{SpanId, TraceId};

    fn sdk_span(pid_ns: Option<u64>) -> Span {
        let mut s = Span::new(TraceId(1), SpanId(2), None, "GET /price", 0, 10);
        s.attributes = Attributes(vec![(ATTR_TID.into(), Value::Int(7))]);
        if let Some(ns) = pid_ns {
            s.attributes.insert(ATTR_PID_NS, Value::Int(ns as i64));
        }
        s.events = vec![Event {
            name: EVENT_ON.into(),
            time_ns: 0,
            attributes: Attributes(vec![
                (ATTR_TID.into(), Value::Int(7)),
                (ATTR_MONO_NS.into(), Value::Int(5)),
            ]),
        }];
        s.refresh_sync();
        s
    }

    #[test]
    fn a_merged_runs_notes_give_each_hosts_bound_as_hosts_json_keeps_it() {
        // Host b's clock is bounded, host c's is not (no key).
        let host = |name: &str, bound: &str| {
            format!(
                r#"{{"host": "{name}", "run": "/runs/{name}", "slope": 1.000001, "offset_ns": -2500.0,
                     "quality": "accurate", "matched": 40, "cpu_base": 0, "cpus": 2{bound}}}"#
            )
        };
        let text = format!(
            r#"{{"reference": 0, "hosts": [{}, {}, {}]}}"#,
            host("a", r#", "max_error_ns": 0.0"#),
            host("b", r#", "max_error_ns": 12345.6"#),
            host("c", "")
        );
        let back = HostsFile::parse(text.as_bytes(), Path::new("hosts.json")).unwrap();
        let notes = alignment_notes(&back);
        assert_eq!(
            notes[0],
            "host a (threads by their tid): the reference clock"
        );
        assert!(
            notes[1].ends_with("t × 1.000001000 -2500 ns; its times are off by at most 12.3 µs"),
            "{}",
            notes[1]
        );
        assert!(
            notes[2].ends_with("t × 1.000001000 -2500 ns"),
            "{}",
            notes[2]
        );
    }

    #[test]
    fn host_numbering_keeps_a_containers_ids_for_the_merged_scan_to_map() {
        let clock = HostClock {
            slope: 1.0,
            offset_ns: 0.0,
            quality: "exact",
            matched: 0,
            max_error_ns: None,
        };
        let ns = 4_026_532_999;
        let mut host = sdk_span(None);
        to_reference(&mut host, 2, &clock, None, None);
        host.refresh_sync();
        let host_seven = host_tid(2, 7) as u32;
        assert_eq!((host.sync.tid, host.sync.pid_ns), (Some(host_seven), None));
        assert_eq!(host.sync.activations[0].tid, host_seven);

        let mut contained = sdk_span(Some(ns));
        to_reference(&mut contained, 2, &clock, None, None);
        contained.refresh_sync();
        assert_eq!(contained.sync.tid, Some(7), "an id of the namespace");
        assert_eq!(contained.sync.activations[0].tid, 7);
        assert_eq!(contained.sync.pid_ns, Some(host_pid_ns(2, ns)));
        assert_ne!(host_pid_ns(2, ns), host_pid_ns(1, ns));
        assert_eq!(host_pid_ns(0, ns), ns, "host 0's are its own");
    }
}
