//! CPU sampling through perf_event_open: one CPU-clock event per CPU, all
//! processes, user and kernel callchains, timestamps on CLOCK_MONOTONIC
//! (the kernel trace's `mono` clock), drained by one thread into
//! `RUN/profile/`.
//!
//! Stacks are walked by the kernel at sample time: frame pointers in user
//! space, ORC in the kernel. DWARF unwinding would copy 8+ KiB of user
//! stack per sample and unwind it later; at 99 Hz on every CPU that is
//! feasible, but the runtimes users profile here (JVM with
//! `-XX:+PreserveFramePointer`, Node, Python ≥ 3.12 `-X perf`, Go) keep
//! frame pointers, so they come first. Code built without them still gets
//! its leaf frame, which names the hot function.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use perf_event::data::Record;
use perf_event::events::Software;
use perf_event::{Builder, Clock, SampleFlag, Sampler as PerfSampler};

use crate::samples::{append_line, save_kallsyms, Sample, SampleWriter};
use crate::Error;
use deepspan_run::profile::{perf_map, MAPS_DIR};

/// Default sampling rate: 99 Hz, off the 100 Hz of periodic kernel work.
pub const DEFAULT_HZ: u64 = 99;

/// Ring buffer per CPU, bytes: ~1 s of deep stacks at 1 kHz.
const RING_BYTES: usize = 512 * 1024;

/// What the sampler counted, for the manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SamplerStats {
    pub samples: u64,
    /// Samples the kernel could not store (the ring was full).
    pub lost: u64,
    pub processes: u64,
}

/// Samples every CPU until [`Sampler::stop`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    drain: Option<JoinHandle<Result<SamplerStats, Error>>>,
    dir: PathBuf,
}

impl Sampler {
    /// Opens and enables the per-CPU events, saves kallsyms, and starts the
    /// draining thread, which writes into `run_dir/profile/`.
    pub fn start(run_dir: &Path, cpus: usize, hz: u64) -> Result<Sampler, Error> {
        if hz == 0 || hz > 10_000 {
            return Err(Error::Config(format!(
                "a sampling rate of {hz} Hz is not between 1 and 10000"
            )));
        }
        let dir = deepspan_run::Run::new(run_dir).profile_dir();
        std::fs::create_dir_all(dir.join(MAPS_DIR)).map_err(|e| Error::io("create", &dir, e))?;
        save_kallsyms(&dir)?;
        let mut rings = Vec::with_capacity(cpus);
        for cpu in 0..cpus {
            let mut builder = Builder::new(Software::CPU_CLOCK);
            builder
                .one_cpu(cpu)
                .any_pid()
                .sample_frequency(hz)
                .sample(
                    SampleFlag::TID | SampleFlag::TIME | SampleFlag::CPU | SampleFlag::CALLCHAIN,
                )
                .clockid(Clock::MONOTONIC)
                .include_kernel()
                // Mappings made while sampling (new processes, dlopen, JIT
                // code files): /proc may be gone by the time we read it.
                .mmap2(true)
                .exclude_idle(true);
            let ring = builder
                .build()
                .and_then(|counter| counter.sampled(RING_BYTES))
                .map_err(|e| Error::PerfEvent { cpu, source: e })?;
            rings.push(ring);
        }
        for (cpu, ring) in rings.iter_mut().enumerate() {
            ring.enable()
                .map_err(|e| Error::PerfEvent { cpu, source: e })?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writer = SampleWriter::create(&dir)?;
        let drain = {
            let (stop, into) = (stop.clone(), dir.clone());
            std::thread::Builder::new()
                .name("deepspan-prof".into())
                .spawn(move || drain(rings, writer, &into, &stop))
                .map_err(|e| Error::io("start the sampling thread for", &dir, e))?
        };
        Ok(Sampler {
            stop,
            drain: Some(drain),
            dir,
        })
    }

    /// Stops sampling, writes what is left, and says what was taken.
    pub fn stop(mut self) -> Result<SamplerStats, Error> {
        self.stop.store(true, Ordering::Release);
        match self.drain.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(Error::Config(format!(
                "the sampling thread for {} panicked",
                self.dir.display()
            ))),
            None => Ok(SamplerStats::default()),
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.drain.take() {
            let _ = t.join();
        }
    }
}

fn drain(
    mut rings: Vec<PerfSampler>,
    mut writer: SampleWriter,
    dir: &Path,
    stop: &AtomicBool,
) -> Result<SamplerStats, Error> {
    let mut stats = SamplerStats::default();
    let mut known: HashSet<i32> = HashSet::new();
    loop {
        // Read the flag first: the pass after it was set empties the rings.
        let last = stop.load(Ordering::Acquire);
        if last {
            for ring in &mut rings {
                let _ = ring.disable();
            }
        }
        for ring in &mut rings {
            while let Some(record) = ring.next_record() {
                match record.parse_record() {
                    Ok(Record::Sample(s)) => {
                        let (Some(pid), Some(tid), Some(time_ns)) = (s.pid(), s.tid(), s.time())
                        else {
                            continue;
                        };
                        let pid = pid as i32;
                        if pid <= 0 {
                            continue;
                        }
                        if known.insert(pid) {
                            copy_maps(dir, pid);
                        }
                        writer.write(&Sample {
                            time_ns,
                            pid,
                            tid: tid as i32,
                            cpu: s.cpu().unwrap_or(u32::MAX),
                            callchain: s.callchain().map(<[u64]>::to_vec).unwrap_or_default(),
                        })?;
                    }
                    Ok(Record::Mmap2(m)) if m.prot & libc::PROT_EXEC as u32 != 0 => {
                        let line = format!(
                            "{:x}-{:x} r-xp {:08x} 00:00 0 {}\n",
                            m.addr,
                            m.addr.saturating_add(m.len),
                            m.pgoff,
                            String::from_utf8_lossy(&m.filename)
                        );
                        let path = dir.join(MAPS_DIR).join(m.pid.to_string());
                        let _ = append_line(&path, &line);
                    }
                    Ok(Record::Lost(l)) => stats.lost += l.lost,
                    _ => {}
                }
            }
        }
        writer.flush()?;
        if last {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for &pid in &known {
        copy_perf_map(dir, pid);
    }
    stats.samples = writer.written();
    stats.processes = known.len() as u64;
    Ok(stats)
}

/// The executable mappings of `pid` now, into `maps/PID` (best effort: the
/// process may be gone; MMAP2 records then cover what it mapped later).
fn copy_maps(dir: &Path, pid: i32) {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return;
    };
    let exec: String = text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|perms| perms.contains('x'))
        })
        .flat_map(|l| [l, "\n"])
        .collect();
    let _ = append_line(&dir.join(MAPS_DIR).join(pid.to_string()), &exec);
}

/// A JIT's `/tmp/perf-PID.map`, copied at the end (it grows as code is compiled).
fn copy_perf_map(dir: &Path, pid: i32) {
    let name = perf_map(pid);
    let _ = std::fs::copy(Path::new("/tmp").join(&name), dir.join(name));
}
