//! Each time a thread left its CPU because its CPU cgroup ran out of
//! quota (CFS bandwidth throttling), for every recording and every flight
//! recorder window.
//!
//! The scheduler has no tracepoint for throttling. A throttled thread's
//! wait looks like any runnable wait in the trace, and the analysis can
//! tell the two apart only by the CPU going idle while the thread waits:
//! when other work keeps that CPU busy, throttling reads as contention. An
//! eBPF program (`bpf/cfs_throttle.bpf.c`) on the BTF-typed `sched_switch`
//! tracepoint reads the mark Linux 6.18 and later put on a throttled task;
//! see its header for why that mark.
//!
//! Written to `RUN/kernel/cfs_throttle.tsv`, one switch-out a line (see
//! [`ThrottledSwitch`]); the flight recorder keeps them in memory and
//! writes each window's with it. A kernel without the mark (before 6.18), or
//! without BPF and BTF, records no file and the manifest's warnings say
//! why; the analysis then infers throttling from idle CPUs alone.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::bpf::{Capture, RecordSink};
use crate::Error;
use deepspan_run::{layout::CFS_THROTTLE, ThrottleManifest};

/// The file's first line; the columns of every other line.
const HEADER: &str = "# deepspan cfs throttle v1: mono_ns cpu tid";

/// A record of the program's ring buffer (`struct held`).
const RECORD_BYTES: usize = 16;

/// A thread switched out, still runnable, because its CPU cgroup ran out
/// of quota: it waits for the quota's refill before it may run again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottledSwitch {
    /// CLOCK_MONOTONIC ns, at the switch-out.
    pub mono_ns: u64,
    pub cpu: u32,
    pub tid: i32,
}

impl ThrottledSwitch {
    /// Parses one line of the throttling file.
    pub fn parse(line: &str) -> Result<ThrottledSwitch, String> {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let [mono_ns, cpu, tid] = fields[..] else {
            return Err(format!("{} fields, expected 3 ({HEADER})", fields.len()));
        };
        fn num<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not a number in range"))
        }
        Ok(ThrottledSwitch {
            mono_ns: num("time", mono_ns)?,
            cpu: num("cpu", cpu)?,
            tid: num("tid", tid)?,
        })
    }

    /// The line [`ThrottledSwitch::parse`] reads back.
    pub fn line(&self) -> String {
        format!("{} {} {}", self.mono_ns, self.cpu, self.tid)
    }

    /// A record of the program's ring buffer, or None when it is not one.
    fn from_record(b: &[u8]) -> Option<ThrottledSwitch> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        Some(ThrottledSwitch {
            mono_ns: u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes")),
            cpu: u32_at(8),
            tid: u32_at(12) as i32,
        })
    }
}

/// Reads a run's throttling file: every switch-out, in file order. A last
/// line without its newline is what a killed recorder left mid-write: it
/// is left out.
pub fn read_throttled_switches(path: &Path) -> Result<Vec<ThrottledSwitch>, Error> {
    let bad = |reason: String| Error::Io {
        action: "read the throttled switch-outs",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    };
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let complete = &text[..text.rfind('\n').map_or(0, |n| n + 1)];
    let mut switches = Vec::new();
    for (n, line) in complete.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        switches
            .push(ThrottledSwitch::parse(line).map_err(|e| bad(format!("line {}: {e}", n + 1)))?);
    }
    Ok(switches)
}

/// The running capture.
pub(crate) struct ThrottleCapture {
    capture: Capture<ThrottleManifest>,
    path: PathBuf,
}

impl ThrottleCapture {
    /// Loads and attaches the program; once this returns, every throttled
    /// switch-out is captured. An error says why this kernel or build cannot.
    pub(crate) fn start(run: &Path) -> Result<ThrottleCapture, String> {
        let ring = program::attach()?;
        let path = run.join(CFS_THROTTLE);
        let file =
            File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let sink = SwitchSink::new(file)?;
        let capture = Capture::start("deepspan-throttle", ring, sink).map_err(|e| e.to_string())?;
        Ok(ThrottleCapture { capture, path })
    }

    /// Detaches the program (once the ring is drained) and returns what
    /// was written.
    pub(crate) fn stop(self) -> Result<ThrottleManifest, String> {
        let written = self
            .capture
            .stop()
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        Ok(ThrottleManifest {
            file: CFS_THROTTLE.into(),
            ..written
        })
    }
}

/// The flight recorder's throttled switch-outs: kept in memory, the
/// oldest dropped beyond [`ThrottleHistory::MAX`], and written with each
/// window ([`ThrottleHistory::write_window`]).
pub(crate) struct ThrottleHistory {
    switches: Arc<Mutex<VecDeque<ThrottledSwitch>>>,
    _capture: Capture<()>,
}

impl ThrottleHistory {
    /// Switch-outs kept: a thread throttled in every 100 ms period makes
    /// 10 a second, so 100 000 are minutes of a busy host's throttling.
    const MAX: usize = 100_000;

    pub(crate) fn start() -> Result<ThrottleHistory, String> {
        let ring = program::attach()?;
        let switches = Arc::new(Mutex::new(VecDeque::new()));
        let sink = HistorySink(switches.clone());
        let capture = Capture::start("deepspan-throttle", ring, sink).map_err(|e| e.to_string())?;
        Ok(ThrottleHistory {
            switches,
            _capture: capture,
        })
    }

    /// Writes the switch-outs from `since_ns` to `end_ns` into `run`'s
    /// throttling file, and forgets those before `since_ns` (the history
    /// of the trace no longer reaches them).
    pub(crate) fn write_window(
        &self,
        run: &Path,
        since_ns: u64,
        end_ns: u64,
    ) -> Result<ThrottleManifest, String> {
        let mut switches = self.switches.lock().unwrap_or_else(|e| e.into_inner());
        while switches.front().is_some_and(|s| s.mono_ns < since_ns) {
            switches.pop_front();
        }
        let path = run.join(CFS_THROTTLE);
        let file =
            File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let mut sink = SwitchSink::new(file)?;
        for s in switches.iter().filter(|s| s.mono_ns <= end_ns) {
            sink.push_switch(s)?;
        }
        let written = sink.finish(0)?;
        Ok(ThrottleManifest {
            file: CFS_THROTTLE.into(),
            ..written
        })
    }
}

/// Keeps switch-outs in the flight recorder's history.
struct HistorySink(Arc<Mutex<VecDeque<ThrottledSwitch>>>);

impl RecordSink for HistorySink {
    type Summary = ();

    fn push(&mut self, record: &[u8]) -> Result<(), String> {
        if let Some(switch) = ThrottledSwitch::from_record(record) {
            let mut switches = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if switches.len() == ThrottleHistory::MAX {
                switches.pop_front();
            }
            switches.push_back(switch);
        }
        Ok(())
    }

    fn finish(self, _lost: u64) -> Result<(), String> {
        Ok(())
    }
}

/// The throttling file being written, with its counts.
struct SwitchSink {
    out: BufWriter<File>,
    manifest: ThrottleManifest,
}

impl SwitchSink {
    fn new(file: File) -> Result<SwitchSink, String> {
        let mut out = BufWriter::with_capacity(1 << 16, file);
        writeln!(out, "{HEADER}").map_err(write_error)?;
        Ok(SwitchSink {
            out,
            manifest: ThrottleManifest::default(),
        })
    }

    fn push_switch(&mut self, switch: &ThrottledSwitch) -> Result<(), String> {
        writeln!(self.out, "{}", switch.line()).map_err(write_error)?;
        self.manifest.switches += 1;
        Ok(())
    }
}

impl RecordSink for SwitchSink {
    type Summary = ThrottleManifest;

    fn push(&mut self, record: &[u8]) -> Result<(), String> {
        match ThrottledSwitch::from_record(record) {
            Some(switch) => self.push_switch(&switch),
            None => Ok(()),
        }
    }

    fn finish(mut self, lost: u64) -> Result<ThrottleManifest, String> {
        self.out.flush().map_err(write_error)?;
        self.manifest.lost = lost;
        Ok(self.manifest)
    }
}

fn write_error(e: std::io::Error) -> String {
    format!("cannot write the throttled switch-outs: {e}")
}

#[cfg(deepspan_bpf)]
mod program {
    use crate::bpf::Ring;

    /// The ELF reader needs the object aligned, which include_bytes! is not.
    static OBJECT: &[u8] =
        aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cfs_throttle.bpf.o"));

    pub(super) fn attach() -> Result<Ring, String> {
        crate::bpf::load_sched_switch(
            OBJECT,
            "the CPU throttling program",
            "HELD",
            "it reads the throttled mark of Linux 6.18 and later",
        )
    }
}

#[cfg(not(deepspan_bpf))]
mod program {
    pub(super) fn attach() -> Result<crate::bpf::Ring, String> {
        Err(crate::bpf::not_built("CPU throttling"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_back() {
        let line = "457084414274 1 8193";
        let s = ThrottledSwitch::parse(line).unwrap();
        assert_eq!(
            s,
            ThrottledSwitch {
                mono_ns: 457084414274,
                cpu: 1,
                tid: 8193
            }
        );
        assert_eq!(s.line(), line);
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(ThrottledSwitch::parse("x 0 0")
            .unwrap_err()
            .contains("time"));
        assert!(ThrottledSwitch::parse("1 0")
            .unwrap_err()
            .contains("2 fields"));
        assert!(ThrottledSwitch::parse("1 0 2147483648")
            .unwrap_err()
            .contains("tid"));
    }

    #[test]
    fn a_ring_record_reads_as_the_program_wrote_it() {
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&457084414274u64.to_ne_bytes());
        record[8..12].copy_from_slice(&1u32.to_ne_bytes());
        record[12..16].copy_from_slice(&8193i32.to_ne_bytes());
        let s = ThrottledSwitch::from_record(&record).unwrap();
        assert_eq!(s.line(), "457084414274 1 8193");
        assert_eq!(ThrottledSwitch::from_record(&record[..12]), None);
    }

    #[test]
    fn the_sink_writes_what_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("throttle.tsv");
        let mut sink = SwitchSink::new(File::create(&path).unwrap()).unwrap();
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&5u64.to_ne_bytes());
        record[12..16].copy_from_slice(&42i32.to_ne_bytes());
        sink.push(&record).unwrap();
        let m = sink.finish(2).unwrap();
        assert_eq!((m.switches, m.lost), (1, 2));
        let expected = vec![ThrottledSwitch {
            mono_ns: 5,
            cpu: 0,
            tid: 42,
        }];
        assert_eq!(read_throttled_switches(&path).unwrap(), expected);
        // A recorder killed mid-line: the torn line is left out.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("6 0");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_throttled_switches(&path).unwrap(), expected);
        // A bad complete line is an error that says where.
        std::fs::write(&path, "# header\n5 0 42\n6 x 42\n").unwrap();
        let e = read_throttled_switches(&path).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("cpu"), "{e}");
    }
}
