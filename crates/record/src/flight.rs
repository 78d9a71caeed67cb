//! A long-lived flight recorder that writes chosen time windows as run
//! folders: the live agent's kernel history.
//!
//! `record --mode flight` snapshots the whole ring buffer on a signal. The
//! agent needs something else: many snapshots of short windows that lie in
//! the past (a span is judged slow only once it has ended and reached the
//! agent), often overlapping each other. So:
//! - the kernel ring buffer runs in overwrite mode; its pages are read
//!   (a copy, no decoding) into a per-CPU history in memory, bounded in
//!   bytes, when the owner asks ([`FlightRecorder::drain_into_history`]:
//!   the agent does every 100 ms, so the history's size is how far back
//!   a snapshot reaches) and before each snapshot. A snapshot writes the
//!   pages that overlap its window and keeps them: a later window that
//!   overlaps an earlier one still finds its events;
//! - each CPU knows how far back its history reaches (the start, or the
//!   oldest page it still holds). A window that starts before that on any
//!   CPU has left the buffer and is refused with
//!   [`WindowOutcome::LeftBuffer`]. Events the kernel overwrote before they
//!   were read (a burst faster than the reads) are a hole, not the end of
//!   the history: the page after it carries the kernel's missed-events mark,
//!   and readers count them as lost events there, as in a standard
//!   recording.
//!
//! A page covers the time from its own timestamp (its first event's) to
//! the next page's, so the pages kept for a window are those from the last
//! one starting at or before the window's start to the last one starting
//! before its end.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use deepspan_ftrace::write::write_trace_dat;
use deepspan_ftrace::TraceDatMeta;

use crate::capture_file::History;
use crate::events::{resolve_events, EventId};
use crate::meta::{instance_cpus, read_stats, static_meta, Tasks};
use crate::procscan::ProcessScan;
use crate::sched_switch::SwitchProgram;
use crate::session::{clock_point, cpu_manifest, create_instance, instance_page_size};
use crate::tracefs::{Instance, Tracefs};
use crate::{sys, Error, EventSelection};
use crate::{BlockedSyscall, IdleSwitch, SocketCall, ThrottledSwitch};
use deepspan_run::{layout, ClockPoint, Manifest, OtlpPorts, Run, FORMAT_VERSION};

/// How the flight recorder is set up.
#[derive(Clone, Debug)]
pub struct FlightOptions {
    /// Kernel ring buffer per CPU, KiB: the history between snapshots.
    pub buffer_kb_per_cpu: u64,
    /// Pages kept in memory per CPU after a snapshot drained them, KiB.
    pub history_kb_per_cpu: u64,
    pub events: EventSelection,
    /// Written into each snapshot's manifest (where the agent listens).
    pub otlp: OtlpPorts,
}

impl Default for FlightOptions {
    /// 8 MiB per CPU in the kernel, 32 MiB per CPU of history in memory,
    /// the `analysis` events.
    fn default() -> FlightOptions {
        FlightOptions {
            buffer_kb_per_cpu: 8 << 10,
            history_kb_per_cpu: 32 << 10,
            events: EventSelection::default(),
            otlp: OtlpPorts {
                grpc_port: 0,
                http_port: 0,
                receiver: None,
            },
        }
    }
}

/// What [`FlightRecorder::snapshot`] did with a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowOutcome {
    /// The run folder was written.
    Written { bytes: u64, pages: usize },
    /// Part of the window is no longer held: on some CPU the history reaches
    /// back only to `complete_since_ns` (mono), after the window's start.
    LeftBuffer { complete_since_ns: u64 },
}

/// One CPU's pages, oldest first.
#[derive(Default)]
struct CpuHistory {
    pages: VecDeque<Vec<u8>>,
    bytes: usize,
    /// How far back the history reaches (mono): the start, or the oldest
    /// page held once older ones were let go.
    complete_since_ns: u64,
}

fn page_ts(page: &[u8]) -> u64 {
    u64::from_ne_bytes(page[..8].try_into().expect("a page has a header"))
}

fn page_commit(page: &[u8]) -> u64 {
    u64::from_ne_bytes(page[8..16].try_into().expect("a page has a header"))
}

impl CpuHistory {
    fn push(&mut self, page: Vec<u8>, limit: usize) {
        self.bytes += page.len();
        self.pages.push_back(page);
        while self.bytes > limit && self.pages.len() > 1 {
            let old = self.pages.pop_front().expect("more than one page");
            self.bytes -= old.len();
            let next = self.pages.front().expect("one page left");
            self.complete_since_ns = self.complete_since_ns.max(page_ts(next));
        }
    }

    /// The indexes of the pages that hold events of `[start, end]`.
    fn window(&self, start: u64, end: u64) -> std::ops::Range<usize> {
        let first = self
            .pages
            .iter()
            .rposition(|p| page_ts(p) <= start)
            .unwrap_or(0);
        let last = self
            .pages
            .iter()
            .rposition(|p| page_ts(p) <= end)
            .map_or(first, |i| i + 1);
        first..last.max(first)
    }
}

/// A tracefs instance in overwrite mode for the life of the value, and the
/// pages read from it. Dropping it removes the instance (so does
/// `record --cleanup` after a SIGKILL: the instance is named after this
/// process, like every recorder's).
pub struct FlightRecorder {
    /// Each CPU's `trace_pipe_raw`, open for the recorder's life (None: a
    /// CPU without a buffer). First, so it is closed before the instance
    /// is removed on drop: an open file keeps the instance busy.
    raw_files: Vec<Option<File>>,
    instance: Instance,
    tracefs: Tracefs,
    events: Vec<EventId>,
    cpus: Vec<CpuHistory>,
    page_size: u32,
    meta: TraceDatMeta,
    tasks: Tasks,
    options: FlightOptions,
    clock_samples: VecDeque<[u64; 2]>,
    warnings: Vec<String>,
    /// The boot the recorder started in, for every window's manifest.
    boot_id: Option<String>,
    /// Throttled switch-outs, when this kernel and build can say.
    throttle: Option<History<ThrottledSwitch>>,
    /// Sleeps in system calls, when this kernel and build can say.
    syscalls: Option<History<BlockedSyscall>>,
    /// Socket receives and sends, when this kernel and build can say.
    sockets: Option<History<SocketCall>>,
    /// Switches out of idle, which ftrace loses, when this kernel and
    /// build can say.
    idle: Option<History<IdleSwitch>>,
}

/// Clock samples kept: one a second for an hour is more than any window needs.
const MAX_CLOCK_SAMPLES: usize = 3600;

impl FlightRecorder {
    /// Creates the instance and starts tracing. Every thread is traced,
    /// this process's too: ftrace's pid filter would also drop the
    /// interrupts that run while a left-out thread is current, and the
    /// wake-ups in them would lose their cause. The agent's threads are
    /// busy (the reader of these buffers, the forwarder's and receiver's
    /// loopback traffic), so under a filter an application thread woken by
    /// its disk or its network while one of them ran would read as woken
    /// by nothing; traced, they cost a few events per batch of spans.
    pub fn start(options: FlightOptions) -> Result<FlightRecorder, Error> {
        if options.buffer_kb_per_cpu == 0 || options.history_kb_per_cpu == 0 {
            return Err(Error::InvalidOptions(
                "the flight recorder needs a buffer and a history of at least 1 KiB".into(),
            ));
        }
        // Unattended, it must not record less than it says: each mount,
        // namespace or capability it lacks is an error.
        let missing = crate::host_access::missing();
        if !missing.is_empty() {
            return Err(Error::HostAccess(missing));
        }
        let tracefs = Tracefs::open()?;
        let events = match &options.events {
            EventSelection::Spec(spec) => resolve_events(spec, &tracefs)?,
            EventSelection::Events(events) => events.clone(),
        };
        let (instance, mut warnings) =
            create_instance(&tracefs, options.buffer_kb_per_cpu, &events)?;
        let cpu_count = instance_cpus(&instance.path(""))?;
        let page_size = instance_page_size(&instance);
        let meta = static_meta(&tracefs, &events, page_size)?;
        let mut raw_files = Vec::with_capacity(cpu_count);
        for cpu in 0..cpu_count {
            let path = instance.path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let raw = match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => Some(f),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV) | Some(libc::ENOENT)) => {
                    None
                }
                Err(e) => return Err(Error::tracefs("open", &path, e)),
            };
            raw_files.push(raw);
        }
        let mut tasks = Tasks::default();
        tasks.scan_proc();
        let mut switch = SwitchProgram::default();
        let throttle = History::start(&mut switch, &mut warnings);
        let syscalls = History::start(&mut switch, &mut warnings);
        let sockets = History::start(&mut switch, &mut warnings);
        let idle = History::start(&mut switch, &mut warnings);
        let start = clock_point();
        instance.write("tracing_on", "1")?;
        let cpus = (0..cpu_count)
            .map(|_| CpuHistory {
                complete_since_ns: start.mono_ns,
                ..CpuHistory::default()
            })
            .collect();
        Ok(FlightRecorder {
            instance,
            tracefs,
            events,
            cpus,
            raw_files,
            page_size,
            meta,
            tasks,
            options,
            clock_samples: VecDeque::from([[start.realtime_ns, start.mono_ns]]),
            warnings,
            boot_id: crate::journal::boot_id(),
            throttle,
            syscalls,
            sockets,
            idle,
        })
    }

    /// What the recorder records without (an event or capture this kernel
    /// does not allow), as it found when it started.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tracefs instance's name (for logs and tests).
    pub fn instance_name(&self) -> String {
        self.instance.name()
    }

    /// Takes a realtime/monotonic clock sample; call about once a second,
    /// so every window has samples around it for mapping span times.
    pub fn sample_clock(&mut self) {
        let p = clock_point();
        if self.clock_samples.len() == MAX_CLOCK_SAMPLES {
            self.clock_samples.pop_front();
        }
        self.clock_samples.push_back([p.realtime_ns, p.mono_ns]);
    }

    /// How far back (mono ns) every CPU's history reaches now: a window
    /// starting earlier would be refused ([`WindowOutcome::LeftBuffer`]).
    pub fn reaches_back_to_ns(&self) -> u64 {
        self.cpus
            .iter()
            .map(|c| c.complete_since_ns)
            .max()
            .unwrap_or(0)
    }

    /// The realtime → mono offset of the latest sample (mono = realtime + offset).
    pub fn mono_minus_realtime_ns(&self) -> i128 {
        let [realtime, mono] = *self.clock_samples.back().expect("a sample from the start");
        mono as i128 - realtime as i128
    }

    /// Writes the events of `[start_ns, end_ns]` (mono) into `run_dir` as a
    /// run folder (manifest.json, kernel/trace.dat, kernel/saved_tgids,
    /// processes.json), or says the window has left the buffer. The window
    /// should have ended: later events are not waited for.
    pub fn snapshot(
        &mut self,
        start_ns: u64,
        end_ns: u64,
        run_dir: &Path,
    ) -> Result<WindowOutcome, Error> {
        if end_ns < start_ns {
            return Err(Error::InvalidOptions(format!(
                "window ends ({end_ns}) before it starts ({start_ns})"
            )));
        }
        let now = clock_point();
        self.drain(now.mono_ns)?;
        let complete_since_ns = self.reaches_back_to_ns();
        if complete_since_ns > start_ns {
            return Ok(WindowOutcome::LeftBuffer { complete_since_ns });
        }
        self.sample_clock();

        let run = Run::new(run_dir);
        let kernel_dir = run.kernel_dir();
        fs::create_dir_all(&kernel_dir)
            .map_err(|e| Error::output("create", &kernel_dir, run_dir, e))?;
        let mut files = Vec::with_capacity(self.cpus.len());
        let mut bytes_per_cpu = Vec::with_capacity(self.cpus.len());
        let mut pages = 0;
        let written = (|| {
            for (cpu, history) in self.cpus.iter().enumerate() {
                let path = run.raw_pages(cpu);
                let mut data = Vec::new();
                for page in history.pages.range(history.window(start_ns, end_ns)) {
                    data.extend_from_slice(page);
                    pages += 1;
                }
                fs::write(&path, &data).map_err(|e| Error::output("write", &path, run_dir, e))?;
                bytes_per_cpu.push(data.len() as u64);
                files.push(path);
            }
            let stats = read_stats(&self.instance.path(""), self.cpus.len());
            self.tasks.add_kernel(&self.tracefs);
            self.tasks.scan_proc();
            self.meta.cmdlines = self.tasks.cmdlines();
            self.meta.cpu_stats = stats.iter().map(|(text, _)| text.clone()).collect();
            let trace = run.trace_dat();
            write_trace_dat(&trace, &self.meta, &files)?;
            let tgids = run.saved_tgids();
            fs::write(&tgids, self.tasks.tgids())
                .map_err(|e| Error::output("write", &tgids, run_dir, e))?;
            let mut processes = ProcessScan::default();
            processes.scan();
            let scan = run.processes();
            fs::write(&scan, processes.to_json())
                .map_err(|e| Error::output("write", &scan, run_dir, e))?;
            let mut manifest = self.manifest(start_ns, end_ns, &stats, &bytes_per_cpu);
            let warnings = &mut manifest.warnings;
            // A thread switched out up to a quota period (at most 1 s)
            // before the trace's history begins may still be held back in
            // it.
            let since = complete_since_ns.saturating_sub(1_000_000_000);
            let throttle = self.throttle.as_ref();
            let cfs_throttle =
                throttle.and_then(|h| h.write_window(run_dir, since, end_ns, warnings));
            // The others from where the trace's history begins: a sleep or
            // a call is read with the trace around it.
            let since = complete_since_ns;
            let syscalls = self.syscalls.as_ref();
            let blocked_syscalls =
                syscalls.and_then(|h| h.write_window(run_dir, since, end_ns, warnings));
            let sockets = self.sockets.as_ref();
            let socket_calls =
                sockets.and_then(|h| h.write_window(run_dir, since, end_ns, warnings));
            let idle = self.idle.as_ref();
            let idle_switches = idle.and_then(|h| h.write_window(run_dir, since, end_ns, warnings));
            manifest.cfs_throttle = cfs_throttle;
            manifest.blocked_syscalls = blocked_syscalls;
            manifest.socket_calls = socket_calls;
            manifest.idle_switches = idle_switches;
            manifest.save(run_dir)?;
            Ok::<u64, Error>(bytes_per_cpu.iter().sum())
        })();
        for f in &files {
            let _ = fs::remove_file(f);
        }
        Ok(WindowOutcome::Written {
            bytes: written?,
            pages,
        })
    }

    /// Reads what the kernel holds now into the history (bounded by
    /// `history_kb_per_cpu`), where the kernel can no longer overwrite it.
    /// The agent calls it while windows wait to be written, so that a busy
    /// machine cannot wrap the buffer over them meanwhile.
    pub fn drain_into_history(&mut self) -> Result<(), Error> {
        self.drain(clock_point().mono_ns)
    }

    /// Reads every CPU's kernel buffer into its history, up to pages that
    /// start after `until_ns` (a busy CPU cannot keep the drain going).
    fn drain(&mut self, until_ns: u64) -> Result<(), Error> {
        let page_size = self.page_size as usize;
        let limit = (self.options.history_kb_per_cpu * 1024) as usize;
        for (cpu, (history, raw)) in self.cpus.iter_mut().zip(&mut self.raw_files).enumerate() {
            let Some(raw) = raw.as_mut() else { continue };
            loop {
                let mut page = vec![0u8; page_size];
                let mut fill = 0;
                while fill < page_size {
                    match raw.read(&mut page[fill..]) {
                        Ok(0) => break,
                        Ok(n) => fill += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            let path = self
                                .instance
                                .path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
                            return Err(Error::tracefs("read", &path, e));
                        }
                    }
                }
                if fill == 0 {
                    break;
                }
                // Neither events nor a lost-events mark: nothing to keep.
                if page_commit(&page) == 0 {
                    continue;
                }
                let ts = page_ts(&page);
                history.push(page, limit);
                if ts > until_ns {
                    break;
                }
            }
        }
        Ok(())
    }

    fn manifest(
        &self,
        start_ns: u64,
        end_ns: u64,
        stats: &[(String, crate::tracefs::CpuStats)],
        bytes_per_cpu: &[u64],
    ) -> Manifest {
        let offset = self.mono_minus_realtime_ns();
        let point = |mono: u64| ClockPoint {
            realtime_ns: (mono as i128 - offset).max(0) as u64,
            mono_ns: mono,
        };
        let u = sys::uname();
        Manifest {
            format_version: FORMAT_VERSION,
            host: u[1].clone(),
            kernel_release: u[2].clone(),
            cpus: self.cpus.len(),
            page_size: self.page_size,
            trace_clock: "mono".into(),
            events: self.events.iter().map(EventId::to_string).collect(),
            mode: crate::Mode::Flight.as_str().into(),
            buffer_kb_per_cpu: self.options.buffer_kb_per_cpu,
            pids: Vec::new(),
            start: point(start_ns),
            end: point(end_ns),
            clock_samples: self.clock_samples.iter().copied().collect(),
            per_cpu: stats
                .iter()
                .enumerate()
                .map(|(cpu, (_, s))| {
                    cpu_manifest(cpu, s, bytes_per_cpu.get(cpu).copied().unwrap_or(0))
                })
                .collect(),
            // Overwriting is the point of a flight recorder; a window whose
            // events were overwritten is refused instead (LeftBuffer).
            lost_events: stats
                .iter()
                .map(|(_, s)| s.commit_overrun + s.dropped_events)
                .sum(),
            kernel_trace: Some(layout::TRACE_DAT.into()),
            snapshots: Vec::new(),
            otlp: self.options.otlp.clone(),
            command: Vec::new(),
            exit_code: None,
            tgids: Some(layout::SAVED_TGIDS.into()),
            processes: Some(layout::PROCESSES.into()),
            warnings: self.warnings.clone(),
            // Every thread is traced (see `start`).
            recorder_tids: Vec::new(),
            profile: None,
            boot_id: self.boot_id.clone(),
            tcp_keys: None,
            cfs_throttle: None,
            blocked_syscalls: None,
            socket_calls: None,
            idle_switches: None,
            hosts: None,
        }
    }

    /// Stops tracing and removes the instance (dropping does the same, but
    /// only this reports a failure).
    pub fn stop(mut self) -> Result<(), Error> {
        let _ = self.instance.write("tracing_on", "0");
        self.raw_files.clear();
        self.instance.remove()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's mark on a page after events it overwrote.
    const RB_MISSED_EVENTS: u64 = 1 << 31;

    fn page(ts: u64, missed: bool) -> Vec<u8> {
        let mut p = vec![0u8; 64];
        p[..8].copy_from_slice(&ts.to_ne_bytes());
        let commit = 16 | if missed { RB_MISSED_EVENTS } else { 0 };
        p[8..16].copy_from_slice(&commit.to_ne_bytes());
        p
    }

    fn history(ts: &[u64]) -> CpuHistory {
        let mut h = CpuHistory::default();
        for &t in ts {
            h.push(page(t, false), usize::MAX);
        }
        h
    }

    #[test]
    fn a_window_takes_the_page_it_starts_in_and_every_page_starting_before_its_end() {
        let h = history(&[10, 20, 30, 40]);
        assert_eq!(h.window(25, 35), 1..3, "pages from 20 (holds 25) and 30");
        assert_eq!(h.window(20, 20), 1..2);
        assert_eq!(
            h.window(5, 12),
            0..1,
            "before the first page: from the first"
        );
        assert_eq!(h.window(45, 50), 3..4, "the last page runs to now");
    }

    #[test]
    fn the_history_is_bounded_and_knows_since_when_it_is_complete() {
        let mut h = CpuHistory {
            complete_since_ns: 1,
            ..CpuHistory::default()
        };
        for t in [10, 20, 30] {
            h.push(page(t, false), 128);
        }
        assert_eq!(h.pages.len(), 2);
        assert_eq!(h.complete_since_ns, 20, "the page from 10 was let go");
        h.push(page(50, true), 192);
        assert_eq!(
            h.pages.len(),
            3,
            "a hole the kernel made is lost events, not the history's end"
        );
        assert_eq!(h.complete_since_ns, 20);
    }
}
