//! Each time a thread left its CPU because its CPU cgroup ran out of
//! quota (CFS bandwidth throttling), for every recording and every flight
//! recorder window.
//!
//! The scheduler has no tracepoint for throttling. A throttled thread's
//! wait looks like any runnable wait in the trace, and the analysis can
//! tell the two apart only by the CPU going idle while the thread waits:
//! when other work keeps that CPU busy, throttling reads as contention. An
//! eBPF program (`bpf/sched_switch.bpf.c`) on the BTF-typed `sched_switch`
//! tracepoint reads the mark Linux 6.18 and later put on a throttled task;
//! see its header for why that mark.
//!
//! Written to `RUN/kernel/cfs_throttle.tsv`, one switch-out a line (see
//! [`ThrottledSwitch`]); the flight recorder keeps them in memory and
//! writes each window's with it. A kernel without the mark (before 6.18), or
//! without BPF and BTF, records no file and the manifest's warnings say
//! why; the analysis then infers throttling from idle CPUs alone.

use std::path::Path;

use crate::bpf::Ring;
use crate::capture_file::{self, CaptureLine, Fields, Recorded, Written};
use crate::sched_switch::{SwitchPart, SwitchProgram};
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

    /// Appends the line (without its newline) to `out`, with no
    /// allocation: the capture's thread writes thousands a second.
    pub fn write_line(&self, out: &mut String) {
        Fields::new(out)
            .num(self.mono_ns)
            .num(self.cpu)
            .num(self.tid);
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

/// The line, written without an allocation.
impl CaptureLine for ThrottledSwitch {
    const HEADER: &'static str = HEADER;

    fn write_line(&self, out: &mut String) {
        Self::write_line(self, out)
    }
    const WHAT: &'static str = "throttled switch-outs";

    fn from_record(record: &[u8]) -> Option<ThrottledSwitch> {
        ThrottledSwitch::from_record(record)
    }

    fn from_line(line: &str) -> Result<ThrottledSwitch, String> {
        ThrottledSwitch::parse(line)
    }

    fn mono_ns(&self) -> u64 {
        self.mono_ns
    }
}

/// Reads a run's throttling file: every switch-out, in file order. A last
/// line without its newline is what a killed recorder left mid-write: it
/// is left out.
pub fn read_throttled_switches(path: &Path) -> Result<Vec<ThrottledSwitch>, Error> {
    capture_file::read_file(path)
}

impl Recorded for ThrottledSwitch {
    const FILE: &'static str = CFS_THROTTLE;
    const THREAD: &'static str = "deepspan-throttle";
    /// A thread throttled in every 100 ms period makes 10 a second, so
    /// 100 000 are minutes of a busy host's throttling.
    const HISTORY: usize = 100_000;
    const WITHOUT: &'static str = ": the analysis infers CPU throttling from idle CPUs";
    type Section = ThrottleManifest;

    fn attach(switch: &mut SwitchProgram) -> Result<Ring, String> {
        switch.ring(SwitchPart::Throttle)
    }

    fn section(written: Written) -> ThrottleManifest {
        ThrottleManifest {
            file: CFS_THROTTLE.into(),
            switches: written.records,
            lost: written.lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::RecordSink;
    use crate::capture_file::FileSink;

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
        let mut sink = FileSink::<ThrottledSwitch>::create(&path).unwrap();
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&5u64.to_ne_bytes());
        record[12..16].copy_from_slice(&42i32.to_ne_bytes());
        sink.push(&record).unwrap();
        let m = ThrottledSwitch::section(sink.finish(2).unwrap());
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
