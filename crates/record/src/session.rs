//! One recording, from instance setup to manifest.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deepspan_ftrace::{write_trace_dat, TraceDatMeta};

use crate::capture::{drain_cpu, DrainLimit, Streams};
use crate::capture_file::RunCapture;
use crate::events::{resolve_events, EventId};
use crate::journal::{InstanceOwner, Journal, ProcessId};
use crate::meta::{instance_cpus, read_stats, static_meta, Tasks};
use crate::procscan::ProcessScan;
use crate::sched_switch::SwitchProgram;
use crate::tcpkeys::TcpKeyCapture;
use crate::tracefs::{CpuStats, Instance, Tracefs, INSTANCE_PREFIX};
use crate::{sys, Error, EventSelection, Mode, Progress, RecordOptions, RecordSummary};
use crate::{BlockedSyscall, IdleSwitch, SocketCall, ThrottledSwitch};
use deepspan_run::{
    layout, ClockPoint, CpuManifest, Manifest, OtlpPorts, ProfileManifest, Run, Snapshot,
    FORMAT_VERSION,
};

/// Main-loop period: how fast signals, the command's exit and the deadline
/// are noticed.
const TICK: Duration = Duration::from_millis(50);
/// After SIGINT with a command running, how long the command has to exit on
/// its own (it usually got the terminal's SIGINT too) before we forward one.
const SIGINT_FORWARD_AFTER: Duration = Duration::from_secs(1);
/// After SIGINT/SIGTERM, how long we wait for the command before we stop
/// recording anyway (the command is left running).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Records the kernel into the run folder `opts.out`; see the crate docs for
/// what ends up there.
///
/// With a command, it is started once tracing is on and recording lasts
/// until it exits (its status is passed through in
/// [`RecordSummary::exit_code`]); it gets OTEL_EXPORTER_OTLP_ENDPOINT and
/// OTEL_EXPORTER_OTLP_PROTOCOL unless already set. Without one, recording
/// lasts until `opts.duration` or SIGINT/SIGTERM.
///
/// For its duration the function handles SIGINT and SIGTERM (stop cleanly;
/// SIGTERM is forwarded to the command, SIGINT only if the command is still
/// running a second later) and SIGUSR2 (flight-mode snapshot). signal-hook
/// cannot restore the default actions afterwards: these signals are then
/// ignored by the process, which suits a CLI that exits next.
///
/// `progress` is called about once per second.
pub fn record(
    opts: &RecordOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RecordSummary, Error> {
    validate(opts)?;
    let tracefs = Tracefs::open()?;
    let events = match &opts.events {
        EventSelection::Spec(spec) => resolve_events(spec, &tracefs)?,
        EventSelection::Events(list) if list.is_empty() => {
            return Err(Error::InvalidEvents("the event list is empty".into()))
        }
        EventSelection::Events(list) => list.clone(),
    };
    let mut run = RunDir::prepare(&opts.out)?;
    let signals = Signals::install()?;
    let session = Session::setup(opts, &tracefs, events, &run.path)?;
    session.run(opts, &signals, &mut run, progress)
}

fn validate(opts: &RecordOptions) -> Result<(), Error> {
    if opts.buffer_kb_per_cpu == 0 {
        return Err(Error::InvalidOptions(
            "the ring buffer size per CPU must be at least 1 KiB".into(),
        ));
    }
    if let Some(pid) = opts.pids.iter().find(|&&p| p <= 0 || !sys::pid_alive(p)) {
        return Err(Error::InvalidOptions(format!("pid {pid} does not exist")));
    }
    if opts.command.first().is_some_and(|p| p.is_empty()) {
        return Err(Error::InvalidOptions(
            "the command's program name is empty".into(),
        ));
    }
    if opts.tcp_keys && opts.mode != Mode::Standard {
        return Err(Error::InvalidOptions(
            "--tcp-keys records every segment to disk: standard mode only, not flight mode".into(),
        ));
    }
    Ok(())
}

/// The run folder; what we created in it is removed again if the recording
/// fails before capturing anything.
struct RunDir {
    path: PathBuf,
    created: bool,
    keep: bool,
}

impl RunDir {
    fn prepare(path: &Path) -> Result<RunDir, Error> {
        match fs::read_dir(path) {
            Ok(entries) => {
                // The run's OTLP receiver starts first and may have created spans/ already.
                if entries
                    .flatten()
                    .any(|e| e.file_name() != layout::SPANS_DIR)
                {
                    return Err(Error::OutputNotEmpty(path.to_path_buf()));
                }
                Ok(RunDir {
                    path: path.to_path_buf(),
                    created: false,
                    keep: false,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(path)
                    .map_err(|e| Error::output("create the run folder", path, path, e))?;
                Ok(RunDir {
                    path: path.to_path_buf(),
                    created: true,
                    keep: false,
                })
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                Err(Error::OutputNotEmpty(path.to_path_buf()))
            }
            Err(e) => Err(Error::io("open the run folder", path, e)),
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if self.created {
            let _ = fs::remove_dir_all(&self.path);
        } else if let Ok(entries) = fs::read_dir(&self.path) {
            // It was empty before us: everything in it is ours.
            for entry in entries.flatten() {
                let p = entry.path();
                let _ = if p.is_dir() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
            }
        }
    }
}

/// SIGINT/SIGTERM/SIGUSR2 as flags, for the duration of a recording.
struct Signals {
    interrupt: Arc<AtomicBool>,
    terminate: Arc<AtomicBool>,
    snapshot: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    fn install() -> Result<Signals, Error> {
        let mut s = Signals {
            interrupt: Arc::default(),
            terminate: Arc::default(),
            snapshot: Arc::default(),
            ids: Vec::new(),
        };
        for (sig, name, flag) in [
            (signal_hook::consts::SIGINT, "SIGINT", s.interrupt.clone()),
            (signal_hook::consts::SIGTERM, "SIGTERM", s.terminate.clone()),
            (signal_hook::consts::SIGUSR2, "SIGUSR2", s.snapshot.clone()),
        ] {
            let id = signal_hook::flag::register(sig, flag).map_err(|source| Error::Signal {
                signal: name,
                source,
            })?;
            s.ids.push(id);
        }
        Ok(s)
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A configured instance, ready to trace.
struct Session {
    // Field order is drop order: capture threads close their tracefs files
    // before the instance is removed.
    streams: Option<Streams>,
    instance: Instance,
    tracefs: Tracefs,
    events: Vec<EventId>,
    cpus: usize,
    page_size: u32,
    meta: TraceDatMeta,
    tasks: Tasks,
    /// Processes, command lines and listening ports (`processes.json`).
    processes: ProcessScan,
    /// The run folder being written.
    files: Run,
    warnings: Vec<String>,
}

impl Session {
    fn setup(
        opts: &RecordOptions,
        tracefs: &Tracefs,
        events: Vec<EventId>,
        run: &Path,
    ) -> Result<Session, Error> {
        let (instance, warnings) = create_instance(tracefs, opts.buffer_kb_per_cpu, &events)?;
        let cpus = instance_cpus(&instance.path(""))?;
        let page_size = instance_page_size(&instance);
        let meta = static_meta(tracefs, &events, page_size)?;
        let mut tasks = Tasks::default();
        tasks.scan_proc();
        let mut processes = ProcessScan::default();
        processes.scan();
        Ok(Session {
            streams: None,
            instance,
            tracefs: tracefs.clone(),
            events,
            cpus,
            page_size,
            meta,
            tasks,
            processes,
            files: Run::new(run),
            warnings,
        })
    }

    fn run(
        mut self,
        opts: &RecordOptions,
        signals: &Signals,
        run: &mut RunDir,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<RecordSummary, Error> {
        if opts.mode == Mode::Standard {
            let kernel_dir = self.files.kernel_dir();
            fs::create_dir_all(&kernel_dir)
                .map_err(|e| Error::output("create", &kernel_dir, &kernel_dir, e))?;
            let streams = Streams::start(
                &self.instance.path(""),
                self.cpus,
                &self.files,
                self.page_size as usize,
            )?;
            self.streams = Some(streams);
        }
        self.filter_pids(opts)?;
        let start = clock_point();
        let mut samples = vec![[start.realtime_ns, start.mono_ns]];
        let mut manifest = self.initial_manifest(opts, start);
        let mut journal = self.journal(opts, &run.path, &manifest)?;
        // Attached before tracing starts, so that no segment of the
        // recording is missed: `start` returns once the program (compiled
        // into the binary) is loaded, verified and attached.
        let tcp_keys = match opts.tcp_keys {
            true => Some(TcpKeyCapture::start(&run.path, traced_netns(&opts.pids))?),
            false => None,
        };
        // The captures every standard recording makes; the flight
        // recorder keeps its own (`flight.rs`).
        let standard = opts.mode == Mode::Standard;
        let warnings = &mut self.warnings;
        let mut switch = SwitchProgram::default();
        let throttle = standard
            .then(|| RunCapture::<ThrottledSwitch>::start(&run.path, &mut switch, warnings))
            .flatten();
        let syscalls = standard
            .then(|| RunCapture::<BlockedSyscall>::start(&run.path, &mut switch, warnings))
            .flatten();
        let sockets = standard
            .then(|| RunCapture::<SocketCall>::start(&run.path, &mut switch, warnings))
            .flatten();
        let idle = standard
            .then(|| RunCapture::<IdleSwitch>::start(&run.path, &mut switch, warnings))
            .flatten();
        self.instance.write("tracing_on", "1")?;
        let mut sampler = match opts.profile_hz {
            Some(hz) => Some(deepspan_profile::Sampler::start(&run.path, self.cpus, hz)?),
            None => None,
        };
        let mut child = match opts.command.split_first() {
            Some((program, args)) => Some(spawn(program, args, opts)?),
            None => None,
        };
        if let Some(c) = &child {
            journal.add_traced(c.id() as i32, &run.path)?;
        }
        // From here on what was captured is worth keeping, even on error.
        run.keep = true;

        let started = Instant::now();
        let mut next_tick = started + Duration::from_secs(1);
        // The command's services start after the first scan: scanned again
        // every second for 10 s, then at 16, 32, 64 … s (cheap; late
        // starters are seen too).
        let mut ticks = 0u64;
        let mut exit_code = None;
        let mut stop_requested: Option<Instant> = None;
        let (mut forwarded_int, mut forwarded_term) = (false, false);
        let mut snapshots: Vec<Snapshot> = Vec::new();
        let mut capture_error = None;
        loop {
            let now = Instant::now();
            if let Some(c) = child.as_mut() {
                match c.try_wait() {
                    Ok(Some(status)) => {
                        exit_code = Some(
                            status
                                .code()
                                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
                        );
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.warnings
                            .push(format!("cannot wait for the command: {e}"));
                        break;
                    }
                }
            }
            let interrupted = signals.interrupt.load(Ordering::Relaxed);
            let terminated = signals.terminate.load(Ordering::Relaxed);
            if interrupted || terminated {
                let Some(c) = child.as_ref() else { break };
                let since = *stop_requested.get_or_insert(now);
                let pid = c.id() as i32;
                if terminated && !forwarded_term {
                    let _ = sys::send_signal(pid, libc::SIGTERM);
                    forwarded_term = true;
                }
                if interrupted && !forwarded_int && now - since >= SIGINT_FORWARD_AFTER {
                    let _ = sys::send_signal(pid, libc::SIGINT);
                    forwarded_int = true;
                }
                if now - since >= STOP_GRACE {
                    self.warnings.push(format!(
                        "the command (pid {pid}) did not exit within {}s of the stop request; recording stopped, \
                         the command is still running",
                        STOP_GRACE.as_secs()
                    ));
                    break;
                }
            }
            if opts.duration.is_some_and(|d| now - started >= d) {
                if let Some(c) = child.as_ref() {
                    self.warnings.push(format!(
                        "recording duration reached; the command (pid {}) is still running",
                        c.id()
                    ));
                }
                break;
            }
            if self.streams.as_ref().is_some_and(Streams::failed) {
                break;
            }
            if signals.snapshot.swap(false, Ordering::Relaxed) {
                if opts.mode == Mode::Flight {
                    match self.snapshot(opts, snapshots.len() + 1) {
                        Ok(s) => {
                            journal.snapshot(&s, &run.path);
                            snapshots.push(s);
                        }
                        Err(e) => {
                            capture_error = Some(e);
                            break;
                        }
                    }
                } else {
                    self.warnings
                        .push("SIGUSR2 ignored: snapshots exist only in flight mode".into());
                }
            }
            if now >= next_tick {
                ticks += 1;
                let containers_changed = self.processes.runtimes_changed();
                if ticks <= 10 || ticks.is_power_of_two() || containers_changed {
                    self.processes.scan();
                }
                let p = clock_point();
                samples.push([p.realtime_ns, p.mono_ns]);
                journal.clock_sample(p);
                let stats = read_stats(&self.instance.path(""), self.cpus);
                let bytes_per_cpu = match &self.streams {
                    Some(s) => s.bytes(),
                    None => stats.iter().map(|(_, s)| s.bytes).collect(),
                };
                let bytes_written = match &self.streams {
                    Some(s) => s.bytes().iter().sum(),
                    None => snapshots.iter().map(|s| s.bytes).sum(),
                };
                progress(&Progress {
                    elapsed: now - started,
                    bytes_written,
                    bytes_per_cpu,
                    lost_events: lost_events(opts.mode, stats.iter().map(|(_, s)| s)),
                    snapshots: snapshots.len(),
                    command_running: child.is_some(),
                });
                next_tick += Duration::from_secs(1);
                if next_tick < now {
                    next_tick = now + Duration::from_secs(1);
                }
            }
            std::thread::sleep(TICK);
        }

        if let Err(e) = self.instance.write("tracing_on", "0") {
            self.warnings
                .push(format!("cannot stop tracing before the final flush: {e}"));
        }
        let end = clock_point();
        samples.push([end.realtime_ns, end.mono_ns]);
        if let Some(capture) = tcp_keys {
            match capture.stop() {
                Ok(m) => manifest.tcp_keys = Some(m),
                Err(e) => self.warnings.push(format!("TCP segments incomplete: {e}")),
            }
        }
        let warnings = &mut self.warnings;
        manifest.cfs_throttle = throttle.and_then(|c| c.stop(warnings));
        manifest.blocked_syscalls = syscalls.and_then(|c| c.stop(warnings));
        manifest.socket_calls = sockets.and_then(|c| c.stop(warnings));
        manifest.idle_switches = idle.and_then(|c| c.stop(warnings));
        if let (Some(s), Some(hz)) = (sampler.take(), opts.profile_hz) {
            match s.stop() {
                Ok(st) => {
                    manifest.profile = Some(ProfileManifest {
                        dir: layout::PROFILE_DIR.into(),
                        hz,
                        samples: st.samples,
                        lost: st.lost,
                        processes: st.processes,
                    })
                }
                Err(e) => self.warnings.push(format!("CPU samples incomplete: {e}")),
            }
        }

        // Final flush into kernel/cpuN.raw.
        let trace_path = self.files.trace_dat();
        let flushed = match capture_error {
            Some(e) => Err(e),
            None => match self.streams.take() {
                Some(streams) => streams.finish().map(|bytes| (self.raw_files(), bytes)),
                None => self.drain_all(
                    &self.files.kernel_dir(),
                    |cpu| self.files.raw_pages(cpu),
                    None,
                ),
            },
        };
        let stats = read_stats(&self.instance.path(""), self.cpus);
        self.tasks.add_kernel(&self.tracefs);
        self.tasks.scan_proc();
        self.processes.scan();
        if let Err(e) = self.instance.remove() {
            self.warnings
                .push(format!("tracing instance not removed: {e}"));
        }

        manifest.end = end;
        manifest.clock_samples = samples;
        manifest.lost_events = lost_events(opts.mode, stats.iter().map(|(_, s)| s));
        manifest.snapshots = snapshots;
        manifest.exit_code = exit_code;
        let tgids_path = self.files.saved_tgids();

        let (raw_files, bytes) = match flushed {
            Ok(x) => x,
            Err(e) => {
                // Keep what was captured and say so in the manifest.
                manifest.per_cpu = per_cpu(&stats, &[]);
                manifest.warnings = std::mem::take(&mut self.warnings);
                manifest.warnings.push(format!("recording failed: {e}"));
                let _ = manifest.save(&run.path);
                return Err(e);
            }
        };
        manifest.per_cpu = per_cpu(&stats, &bytes);
        self.meta.cmdlines = self.tasks.cmdlines();
        self.meta.cpu_stats = stats.iter().map(|(text, _)| text.clone()).collect();
        if let Err(e) = write_trace_dat(&trace_path, &self.meta, &raw_files) {
            manifest.warnings = std::mem::take(&mut self.warnings);
            manifest.warnings.push(format!(
                "kernel trace not written ({e}); the captured pages are kept in {}/cpuN.raw",
                self.files.kernel_dir().display()
            ));
            let _ = manifest.save(&run.path);
            return Err(e.into());
        }
        for file in &raw_files {
            let _ = fs::remove_file(file);
        }
        manifest.kernel_trace = Some(layout::TRACE_DAT.into());
        match fs::write(&tgids_path, self.tasks.tgids()) {
            Ok(()) => manifest.tgids = Some(layout::SAVED_TGIDS.into()),
            Err(e) => self
                .warnings
                .push(format!("cannot write {}: {e}", tgids_path.display())),
        }
        match fs::write(self.files.processes(), self.processes.to_json()) {
            Ok(()) => manifest.processes = Some(layout::PROCESSES.into()),
            Err(e) => self
                .warnings
                .push(format!("cannot write {}: {e}", layout::PROCESSES)),
        }
        manifest.warnings = std::mem::take(&mut self.warnings);
        manifest.save(&run.path)?;
        journal.finish();
        Ok(RecordSummary {
            run_dir: run.path.clone(),
            kernel_trace: trace_path,
            exit_code,
            events_bytes: bytes.iter().sum(),
            lost_events: manifest.lost_events,
            snapshots: manifest.snapshots.len(),
            warnings: manifest.warnings.clone(),
            manifest,
        })
    }

    /// The manifest as known when tracing starts; the end fills in the rest.
    fn initial_manifest(&self, opts: &RecordOptions, start: ClockPoint) -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            host: opts.host.clone().unwrap_or_else(|| sys::uname()[1].clone()),
            kernel_release: sys::uname()[2].clone(),
            cpus: self.cpus,
            page_size: self.page_size,
            trace_clock: "mono".into(),
            events: self.events.iter().map(EventId::to_string).collect(),
            mode: opts.mode.as_str().into(),
            buffer_kb_per_cpu: opts.buffer_kb_per_cpu,
            pids: opts.pids.clone(),
            start,
            end: start,
            clock_samples: vec![[start.realtime_ns, start.mono_ns]],
            per_cpu: Vec::new(),
            lost_events: 0,
            kernel_trace: None,
            snapshots: Vec::new(),
            otlp: OtlpPorts {
                grpc_port: opts.otlp_grpc_port,
                http_port: opts.otlp_http_port,
                receiver: None,
            },
            command: opts
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            exit_code: None,
            tgids: None,
            processes: None,
            warnings: Vec::new(),
            // Every thread is traced (see `filter_pids`).
            recorder_tids: Vec::new(),
            profile: None,
            boot_id: crate::journal::boot_id(),
            tcp_keys: None,
            cfs_throttle: None,
            blocked_syscalls: None,
            socket_calls: None,
            idle_switches: None,
            hosts: None,
        }
    }

    /// Writes the journal that lets a run survive the recorder's death;
    /// see `journal.rs`. Before tracing starts: no page may exist without it.
    fn journal(
        &mut self,
        opts: &RecordOptions,
        run: &Path,
        manifest: &Manifest,
    ) -> Result<Journal, Error> {
        let kernel_dir = self.files.kernel_dir();
        fs::create_dir_all(&kernel_dir)
            .map_err(|e| Error::output("create", &kernel_dir, run, e))?;
        let owner = InstanceOwner {
            instance: self.instance.name(),
            run_dir: fs::canonicalize(run).unwrap_or_else(|_| run.to_path_buf()),
            recorder: ProcessId::of(std::process::id() as i32),
            traced: opts.pids.iter().map(|&pid| ProcessId::of(pid)).collect(),
        };
        Journal::create(
            run,
            owner,
            manifest.clone(),
            &self.meta,
            &self.tasks.lines(),
            &mut self.warnings,
        )
    }

    /// Sets the pid filter: with `pids`, only those processes and their
    /// children are traced; set as late as possible, since a child forked
    /// between this and tracing_on is followed but its fork is not in the
    /// trace. System-wide, every thread is traced, the recorder's too:
    /// ftrace's pid filter would also drop the interrupts that run while a
    /// left-out thread is current, and the splice threads are busy, so the
    /// wake-ups in those interrupts would lose their cause (a waiter whose
    /// timed futex expired there read as woken by nothing). Their own
    /// system calls add about two events per page they move.
    fn filter_pids(&mut self, opts: &RecordOptions) -> Result<(), Error> {
        if opts.pids.is_empty() {
            return Ok(());
        }
        let pids: Vec<String> = opts.pids.iter().map(i32::to_string).collect();
        self.instance.write("set_event_pid", &pids.join(" "))?;
        self.instance.write("options/event-fork", "1")
    }

    fn raw_files(&self) -> Vec<PathBuf> {
        (0..self.cpus)
            .map(|cpu| self.files.raw_pages(cpu))
            .collect()
    }

    /// Reads every CPU's buffer into `file_of(cpu)`, in `dir`.
    fn drain_all(
        &self,
        dir: &Path,
        file_of: impl Fn(usize) -> PathBuf,
        limit: Option<DrainLimit>,
    ) -> Result<(Vec<PathBuf>, Vec<u64>), Error> {
        fs::create_dir_all(dir).map_err(|e| Error::output("create", dir, dir, e))?;
        let mut files = Vec::with_capacity(self.cpus);
        let mut bytes = Vec::with_capacity(self.cpus);
        for cpu in 0..self.cpus {
            let out = file_of(cpu);
            let raw = self
                .instance
                .path(&format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let result = drain_cpu(&raw, &out, dir, self.page_size as usize, limit);
            files.push(out);
            match result {
                Ok(n) => bytes.push(n),
                Err(e) => {
                    for f in &files {
                        let _ = fs::remove_file(f);
                    }
                    return Err(e);
                }
            }
        }
        Ok((files, bytes))
    }

    /// Flight mode: writes what the ring buffer holds now as
    /// `kernel/snapshots/NNN.dat`, while tracing goes on.
    ///
    /// The pages are read (consumed) from trace_pipe_raw; writers keep
    /// going on the other pages meanwhile, so tracing is never paused. The
    /// drain stops at the first page that starts after the request, so a
    /// busy CPU cannot keep it going. (An instance `snapshot` swap would give
    /// an exact cut across CPUs, but it needs CONFIG_TRACER_SNAPSHOT and a
    /// second buffer of the same size.)
    fn snapshot(&mut self, opts: &RecordOptions, number: usize) -> Result<Snapshot, Error> {
        let at = clock_point();
        let dir = self.files.kernel_snapshots_dir();
        let limit = DrainLimit {
            until_ts: at.mono_ns,
            max_bytes: opts.buffer_kb_per_cpu * 1024 * 2,
        };
        let (files, bytes) = self.drain_all(
            &dir,
            |cpu| self.files.snapshot_raw_pages(number, cpu),
            Some(limit),
        )?;
        let stats = read_stats(&self.instance.path(""), self.cpus);
        self.tasks.add_kernel(&self.tracefs);
        self.meta.cmdlines = self.tasks.cmdlines();
        self.meta.cpu_stats = stats.into_iter().map(|(text, _)| text).collect();
        let name = Run::kernel_snapshot(number);
        let result = write_trace_dat(&self.files.file(&name), &self.meta, &files);
        for f in &files {
            let _ = fs::remove_file(f);
        }
        result?;
        Ok(Snapshot {
            file: name,
            realtime_ns: at.realtime_ns,
            mono_ns: at.mono_ns,
            bytes: bytes.iter().sum(),
        })
    }
}

/// A new tracefs instance of this process, set up as every deepspan
/// recording wants it (mono clock, overwrite, thread group ids, `events`
/// enabled) and still off: the caller writes `tracing_on` when ready.
/// Returns it with the non-fatal problems met.
pub(crate) fn create_instance(
    tracefs: &Tracefs,
    buffer_kb_per_cpu: u64,
    events: &[EventId],
) -> Result<(Instance, Vec<String>), Error> {
    let name = format!(
        "{INSTANCE_PREFIX}{}-{}",
        std::process::id(),
        sys::realtime_ns()
    );
    let instance = Instance::create(tracefs, &name)?;
    // A new instance traces as soon as an event is enabled: keep it off
    // until everything is set.
    instance.write("tracing_on", "0")?;
    instance.write("trace_clock", "mono").map_err(|e| match e {
        Error::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => Error::TracefsUnavailable(
            "this kernel has no 'mono' trace clock, which deepspan needs to line kernel events up with spans".into(),
        ),
        other => other,
    })?;
    instance.write("buffer_size_kb", &buffer_kb_per_cpu.to_string()).map_err(|e| match e {
        Error::Io { source, path, .. } if source.raw_os_error() == Some(libc::ENOMEM) => {
            Error::InvalidOptions(format!(
                "the kernel cannot allocate {} KiB of ring buffer per CPU ({}: {source}); use a smaller buffer",
                buffer_kb_per_cpu,
                path.display()
            ))
        }
        other => other,
    })?;
    // Overwrite in both modes. In standard mode a reader that falls
    // behind then loses the oldest unread pages, and the kernel marks
    // the page where events are missing (readers show "lost events" at
    // that point) besides counting them; with overwrite off the newest
    // events would be dropped with no mark in the data at all.
    instance.write("options/overwrite", "1")?;
    let mut warnings = Vec::new();
    // tid → process mapping for the analysis; optional.
    if let Err(e) = instance.write("options/record-tgid", "1") {
        warnings.push(format!("thread group ids not recorded: {e}"));
    }
    for id in events {
        instance
            .write(&format!("events/{}/{}/enable", id.system, id.name), "1")
            .map_err(|e| match e {
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    Error::UnknownEvent {
                        name: id.to_string(),
                        suggestions: Vec::new(),
                    }
                }
                other => other,
            })?;
    }
    Ok((instance, warnings))
}

/// The ring buffer's page size: the sub-buffer size where the kernel has
/// them, else the system page.
pub(crate) fn instance_page_size(instance: &Instance) -> u32 {
    match instance.read_to_string("buffer_subbuf_size_kb") {
        Ok(kb) => kb.trim().parse::<u32>().ok().map(|kb| kb * 1024),
        Err(_) => None,
    }
    .unwrap_or(sys::system_page_size() as u32)
}

pub(crate) fn clock_point() -> ClockPoint {
    let (realtime_ns, mono_ns) = sys::clock_pair();
    ClockPoint {
        realtime_ns,
        mono_ns,
    }
}

/// Events the kernel could not keep. In flight mode overwriting old events
/// is the point, so overruns are not losses there.
fn lost_events<'a>(mode: Mode, stats: impl Iterator<Item = &'a CpuStats>) -> u64 {
    stats
        .map(|s| {
            let overrun = if mode == Mode::Standard { s.overrun } else { 0 };
            overrun + s.commit_overrun + s.dropped_events
        })
        .sum()
}

fn per_cpu(stats: &[(String, CpuStats)], bytes: &[u64]) -> Vec<CpuManifest> {
    stats
        .iter()
        .enumerate()
        .map(|(cpu, (_, s))| cpu_manifest(cpu, s, bytes.get(cpu).copied().unwrap_or(0)))
        .collect()
}

/// One CPU's line of the manifest: its ring's statistics and the bytes of
/// pages kept from it.
pub(crate) fn cpu_manifest(cpu: usize, s: &CpuStats, bytes: u64) -> CpuManifest {
    CpuManifest {
        cpu,
        entries: s.entries,
        overrun: s.overrun,
        commit_overrun: s.commit_overrun,
        dropped_events: s.dropped_events,
        read_events: s.read_events,
        buffer_bytes: s.bytes,
        bytes,
    }
}

fn spawn(
    program: &std::ffi::OsStr,
    args: &[std::ffi::OsString],
    opts: &RecordOptions,
) -> Result<Child, Error> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        cmd.env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}", opts.otlp_http_port),
        );
    }
    if std::env::var_os("OTEL_EXPORTER_OTLP_PROTOCOL").is_none() {
        cmd.env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    }
    cmd.spawn().map_err(|source| Error::Spawn {
        command: std::iter::once(program)
            .chain(args.iter().map(|a| a.as_os_str()))
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        source,
    })
}

/// The network namespaces of the traced processes (`--pid`), whose TCP
/// segments a run limited to them keeps; empty (all) for a system-wide run.
fn traced_netns(pids: &[i32]) -> Vec<u64> {
    let mut netns: Vec<u64> = pids
        .iter()
        .filter_map(|&pid| crate::tcpkeys::netns_of(pid))
        .collect();
    netns.sort_unstable();
    netns.dedup();
    netns
}
