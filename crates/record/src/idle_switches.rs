//! Each switch of an idle CPU to a thread, for every recording and every
//! flight recorder window.
//!
//! Why: the kernel model knows who runs on a CPU from its switches. On
//! the VM this was written on, ftrace keeps most switches but loses most
//! of those out of the idle task, while a BPF program on the same
//! `sched_switch` tracepoint sees every one (`bpf/sched_switch.bpf.c`
//! gives the figures). The model infers a lost switch-in from the
//! thread's next event of its own: with the system-call events that is
//! microseconds later, without them (the `lean` preset) it can be the
//! thread's next switch-out, and its whole run would read as a wait for a
//! CPU. With this file the switch is where it happened.
//!
//! Written to `RUN/kernel/idle_switches.tsv`: a header line, then one
//! switch a line, fields separated by one space (see [`IdleSwitch`]):
//!
//! ```text
//! # deepspan idle switches v1: mono_ns cpu tid tgid
//! 457084414274 1 8193 8190
//! ```
//!
//! `mono_ns` is CLOCK_MONOTONIC (the trace's clock) at the switch, `tid`
//! and `tgid` are the thread given the CPU (a kernel thread's too). Lines
//! are in the order the program wrote them: time order, but for switches
//! on two CPUs a moment apart. A switch ftrace kept is in both; the model
//! takes the first and skips the other.
//!
//! The flight recorder keeps them in memory and writes each window's with
//! it. A kernel without BPF or BTF, or a build without clang, records no
//! file and the manifest's warnings say why.

use std::path::Path;

use crate::bpf::Ring;
use crate::capture_file::{self, CaptureLine, Fields, Recorded, Written};
use crate::sched_switch::{SwitchPart, SwitchProgram};
use crate::Error;
use deepspan_run::{layout::IDLE_SWITCHES, CaptureManifest};

/// The file's first line; the columns of every other line.
const HEADER: &str = "# deepspan idle switches v1: mono_ns cpu tid tgid";

/// A record of the program's ring buffer (`struct idle_switch`).
const RECORD_BYTES: usize = 24;

/// An idle CPU given to a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleSwitch {
    /// CLOCK_MONOTONIC ns.
    pub mono_ns: u64,
    pub cpu: u32,
    /// The thread switched in.
    pub tid: i32,
    /// Its process.
    pub tgid: i32,
}

impl IdleSwitch {
    /// Parses one line of the idle-switch file.
    pub fn parse(line: &str) -> Result<IdleSwitch, String> {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let [mono_ns, cpu, tid, tgid] = fields[..] else {
            return Err(format!("{} fields, expected 4 ({HEADER})", fields.len()));
        };
        fn num<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not a number in range"))
        }
        let tid: i32 = num("tid", tid)?;
        if tid <= 0 {
            return Err(format!(
                "tid {tid}: the idle task is never switched to itself"
            ));
        }
        Ok(IdleSwitch {
            mono_ns: num("time", mono_ns)?,
            cpu: num("cpu", cpu)?,
            tid,
            tgid: num("tgid", tgid)?,
        })
    }

    /// Appends the line (without its newline) to `out`, with no
    /// allocation: the capture's thread writes thousands a second.
    pub fn write_line(&self, out: &mut String) {
        Fields::new(out)
            .num(self.mono_ns)
            .num(self.cpu)
            .num(self.tid)
            .num(self.tgid);
    }
}

/// The line, written without an allocation.
impl CaptureLine for IdleSwitch {
    const HEADER: &'static str = HEADER;

    fn write_line(&self, out: &mut String) {
        Self::write_line(self, out)
    }
    const WHAT: &'static str = "idle switches";

    fn from_record(b: &[u8]) -> Option<IdleSwitch> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let tid = u32_at(12) as i32;
        (tid > 0).then(|| IdleSwitch {
            mono_ns: u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes")),
            cpu: u32_at(8),
            tid,
            tgid: u32_at(16) as i32,
        })
    }

    fn from_line(line: &str) -> Result<IdleSwitch, String> {
        IdleSwitch::parse(line)
    }

    fn mono_ns(&self) -> u64 {
        self.mono_ns
    }
}

/// Parses the text of an idle-switch file: every switch, in file order.
/// A last line without its newline is what a killed recorder left
/// mid-write: it is left out. A header of another version than v1 is an
/// error, as is any bad line; the error names the line and says why.
pub fn parse_idle_switches(text: &str) -> Result<Vec<IdleSwitch>, String> {
    capture_file::parse_file(text)
}

/// Reads a run's idle-switch file (see [`parse_idle_switches`]).
pub fn read_idle_switches(path: &Path) -> Result<Vec<IdleSwitch>, Error> {
    capture_file::read_file(path)
}

impl Recorded for IdleSwitch {
    const FILE: &'static str = IDLE_SWITCHES;
    const THREAD: &'static str = "deepspan-idle";
    /// 24 bytes each, 24 MB: a host whose CPUs wake from idle 20 000 times
    /// a second fills it in 50 s, longer than the trace's own history on
    /// such a host.
    const HISTORY: usize = 1_000_000;
    type Section = CaptureManifest;

    fn attach(switch: &mut SwitchProgram) -> Result<Ring, String> {
        switch.ring(SwitchPart::Idle)
    }

    fn section(written: Written) -> CaptureManifest {
        CaptureManifest {
            file: IDLE_SWITCHES.into(),
            records: written.records,
            lost: written.lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::RecordSink;
    use crate::capture_file::FileSink;

    fn switch() -> IdleSwitch {
        IdleSwitch {
            mono_ns: 457084414274,
            cpu: 1,
            tid: 8193,
            tgid: 8190,
        }
    }

    #[test]
    fn a_line_reads_back_and_bad_lines_say_why() {
        let line = "457084414274 1 8193 8190";
        assert_eq!(IdleSwitch::parse(line).unwrap(), switch());
        assert_eq!(switch().line(), line);
        for (bad, expected) in [
            ("x 1 2 3", "time"),
            ("1 -1 2 3", "cpu"),
            ("1 0 2147483648 3", "tid"),
            ("1 0 0 0", "tid 0: the idle task"),
            ("1 0 2 3.0", "tgid"),
            ("1 0 2", "3 fields, expected 4"),
        ] {
            let e = IdleSwitch::parse(bad).unwrap_err();
            assert!(e.contains(expected), "{bad}: {e}");
        }
    }

    #[test]
    fn a_ring_record_reads_as_the_program_wrote_it() {
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&457084414274u64.to_ne_bytes());
        record[8..12].copy_from_slice(&1u32.to_ne_bytes());
        record[12..16].copy_from_slice(&8193i32.to_ne_bytes());
        record[16..20].copy_from_slice(&8190i32.to_ne_bytes());
        assert_eq!(IdleSwitch::from_record(&record), Some(switch()));
        assert_eq!(IdleSwitch::from_record(&record[..20]), None);
        // The program never writes the idle task; a record that says so
        // is not one.
        record[12..16].copy_from_slice(&0i32.to_ne_bytes());
        assert_eq!(IdleSwitch::from_record(&record), None);
    }

    #[test]
    fn the_sink_writes_what_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idle_switches.tsv");
        let mut sink = FileSink::<IdleSwitch>::create(&path).unwrap();
        sink.push_line(&switch()).unwrap();
        sink.push(&[0u8; 12]).unwrap();
        assert_eq!(
            IdleSwitch::section(sink.finish(2).unwrap()),
            CaptureManifest {
                file: "kernel/idle_switches.tsv".into(),
                records: 1,
                lost: 2
            }
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "# deepspan idle switches v1: mono_ns cpu tid tgid\n457084414274 1 8193 8190\n"
        );
        assert_eq!(read_idle_switches(&path).unwrap(), vec![switch()]);
        // A torn last line is left out; a bad complete one names its line.
        assert_eq!(
            parse_idle_switches(&format!("{text}45708441 0 7")).unwrap(),
            vec![switch()]
        );
        std::fs::write(&path, format!("{text}5 0 x 42\n")).unwrap();
        let e = read_idle_switches(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 3") && e.contains("idle_switches.tsv"),
            "{e}"
        );
    }
}
