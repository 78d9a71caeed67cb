//! Each time a user thread went to sleep inside a system call: which call,
//! its first three arguments, and the bytes the thread's read-like calls
//! had returned so far, for every recording and every flight recorder
//! window.
//!
//! Why: what a blocked thread waits in (a read on which fd, a futex on
//! which address, a sleep) has come from the `raw_syscalls:sys_enter` and
//! `sys_exit` events, which put every thread of the host on the system-call
//! slow path and are most of a trace's events. Only a thread that sleeps
//! waits in its call, so an eBPF program (`bpf/sched_switch.bpf.c`) on
//! the BTF-typed `sched_switch` tracepoint reads the call from the saved
//! user registers of each thread that switches out to sleep (not
//! preempted, not a kernel thread, not a 32-bit call), as
//! `/proc/PID/syscall` does; see its header. A recording without the
//! syscall events (the `lean` preset) has what its blocked threads waited
//! in from this file: the analysis reads it when the trace has no
//! system-call events (`StateBuilder::blocked_syscall`).
//!
//! The bytes read so far are the kernel's per-thread `rchar` (what
//! `/proc/PID/task/TID/io` shows). Reads that hit the page cache never
//! sleep, so no record is taken at them; two sleeps of a thread bracket
//! the bytes it read between them, which is how a lean recording gives a
//! request's page-cache miss ratio.
//!
//! Written to `RUN/kernel/blocked_syscalls.tsv`: a header line, then one
//! sleep a line, fields separated by one space (see [`BlockedSyscall`]):
//!
//! ```text
//! # deepspan blocked syscalls v2: mono_ns cpu tid tgid nr arg0 arg1 arg2 rchar
//! 457084414274 1 8193 8190 0 0x7 0x7f3a2c001000 0x10000 53248
//! ```
//!
//! `mono_ns` is CLOCK_MONOTONIC at the switch-out (the trace's clock),
//! `nr` the system call number (x86_64's table, as the `sys_enter` event's
//! `id`), and the arguments are hexadecimal, as the registers held them.
//! `rchar` is `-` where the kernel keeps no such count (built without
//! `CONFIG_TASK_XACCT`). Version 1 files, without the column, still read. A
//! thread that sleeps several times in one call has a line for each sleep.
//! A sleep on the way back to user space after the call's `sys_exit` (a
//! stop signal, a ptrace stop) still carries that call. Lines are in the
//! order the program wrote them: time order, but for sleeps on two CPUs a
//! moment apart.
//!
//! The flight recorder keeps them in memory and writes each window's with
//! it. A kernel without BPF and BTF, a build without clang, or an
//! architecture other than x86_64 records no file and the manifest's
//! warnings say why.

use std::path::Path;

use crate::bpf::Ring;
use crate::capture_file::{self, CaptureLine, Fields, Recorded, Written};
use crate::sched_switch::{SwitchPart, SwitchProgram};
use crate::Error;
use deepspan_run::{layout::BLOCKED_SYSCALLS, BlockedSyscallsManifest};

/// The file's first line; the columns of every other line.
const HEADER: &str = "# deepspan blocked syscalls v2: mono_ns cpu tid tgid nr arg0 arg1 arg2 rchar";

/// A record of the program's ring buffer (`struct blocked`).
const RECORD_BYTES: usize = 56;

/// The program's `read_chars` where the kernel keeps no count.
const NO_READ_CHARS: u64 = u64::MAX;

/// A thread went to sleep inside a system call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockedSyscall {
    /// CLOCK_MONOTONIC ns, at the switch-out.
    pub mono_ns: u64,
    pub cpu: u32,
    pub tid: i32,
    /// The thread's process.
    pub tgid: i32,
    /// The system call number, as the `sys_enter` event's `id`.
    pub nr: i32,
    /// The call's first three arguments, as the `sys_enter` event's
    /// `args[0..3]`.
    pub args: [u64; 3],
    /// Bytes the thread's read-like calls had returned when it went to
    /// sleep (the kernel's `rchar`; this call's own bytes come after).
    /// None when the kernel keeps no such count, or the file is of
    /// version 1.
    pub read_chars: Option<u64>,
}

impl BlockedSyscall {
    /// Parses one line of the blocked-syscall file.
    pub fn parse(line: &str) -> Result<BlockedSyscall, String> {
        BlockedSyscall::parse_version(2, line)
    }

    /// Parses one line of a file of `version` (1: without `rchar`).
    fn parse_version(version: u32, line: &str) -> Result<BlockedSyscall, String> {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let (&[mono_ns, cpu, tid, tgid, nr, a0, a1, a2], read_chars) =
            (match (version, &fields[..]) {
                (1, f @ [_, _, _, _, _, _, _, _]) => Some((f, None)),
                (_, [f @ .., rchar]) if version > 1 && f.len() == 8 => Some((f, Some(*rchar))),
                _ => None,
            })
            .ok_or_else(|| {
                format!(
                    "{} fields, expected {} ({HEADER})",
                    fields.len(),
                    if version == 1 { 8 } else { 9 }
                )
            })?
        else {
            unreachable!("matched eight fields")
        };
        fn num<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not a number in range"))
        }
        fn hex(what: &str, text: &str) -> Result<u64, String> {
            text.strip_prefix("0x")
                .filter(|digits| {
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit())
                })
                .and_then(|digits| u64::from_str_radix(digits, 16).ok())
                .ok_or_else(|| format!("{what} {text:?} is not a 64-bit hexadecimal 0x… number"))
        }
        let nr: i32 = num("syscall number", nr)?;
        if nr < 0 {
            // The program never writes one: a negative number means no call.
            return Err(format!("syscall number {nr} is negative"));
        }
        let read_chars = match read_chars {
            None | Some("-") => None,
            Some(n) => Some(num("rchar", n)?),
        };
        Ok(BlockedSyscall {
            mono_ns: num("time", mono_ns)?,
            cpu: num("cpu", cpu)?,
            tid: num("tid", tid)?,
            tgid: num("tgid", tgid)?,
            nr,
            args: [hex("arg0", a0)?, hex("arg1", a1)?, hex("arg2", a2)?],
            read_chars,
        })
    }

    /// Appends the line (without its newline) to `out`, with no
    /// allocation: the capture's thread writes thousands a second.
    pub fn write_line(&self, out: &mut String) {
        let [a0, a1, a2] = self.args;
        let mut fields = Fields::new(out);
        fields
            .num(self.mono_ns)
            .num(self.cpu)
            .num(self.tid)
            .num(self.tgid)
            .num(self.nr)
            .hex(a0)
            .hex(a1)
            .hex(a2);
        match self.read_chars {
            Some(n) => fields.num(n),
            None => fields.text("-"),
        };
    }

    /// A record of the program's ring buffer, or None when it is not one.
    fn from_record(b: &[u8]) -> Option<BlockedSyscall> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Some(BlockedSyscall {
            mono_ns: u64_at(0),
            cpu: u32_at(8),
            tid: u32_at(12) as i32,
            tgid: u32_at(16) as i32,
            nr: u32_at(20) as i32,
            args: [u64_at(24), u64_at(32), u64_at(40)],
            read_chars: Some(u64_at(48)).filter(|&n| n != NO_READ_CHARS),
        })
    }
}

impl CaptureLine for BlockedSyscall {
    const HEADER: &'static str = HEADER;

    fn write_line(&self, out: &mut String) {
        Self::write_line(self, out)
    }
    const WHAT: &'static str = "blocked system calls";

    fn from_record(record: &[u8]) -> Option<BlockedSyscall> {
        BlockedSyscall::from_record(record)
    }

    fn from_line(line: &str) -> Result<BlockedSyscall, String> {
        BlockedSyscall::parse(line)
    }

    const OLDER_VERSIONS: &'static [u32] = &[1];

    fn from_line_of(version: u32, line: &str) -> Result<BlockedSyscall, String> {
        BlockedSyscall::parse_version(version, line)
    }

    fn mono_ns(&self) -> u64 {
        self.mono_ns
    }
}

/// Parses the text of a blocked-syscall file: every sleep, in file order.
/// A last line without its newline is what a killed recorder left
/// mid-write: it is left out. A header of another version than v1 or v2
/// is an error, as is any bad line; the error names the line and says why.
pub fn parse_blocked_syscalls(text: &str) -> Result<Vec<BlockedSyscall>, String> {
    capture_file::parse_file(text)
}

/// Reads a run's blocked-syscall file (see [`parse_blocked_syscalls`]).
pub fn read_blocked_syscalls(path: &Path) -> Result<Vec<BlockedSyscall>, Error> {
    capture_file::read_file(path)
}

impl Recorded for BlockedSyscall {
    const FILE: &'static str = BLOCKED_SYSCALLS;
    const THREAD: &'static str = "deepspan-syscalls";
    /// 56 bytes each, 28 MB: a host whose threads sleep in calls 10 000
    /// times a second fills it in 50 s, longer than the trace's own
    /// history on such a host.
    const HISTORY: usize = 500_000;
    type Section = BlockedSyscallsManifest;

    fn attach(switch: &mut SwitchProgram) -> Result<Ring, String> {
        switch.ring(SwitchPart::Blocked)
    }

    fn section(written: Written) -> BlockedSyscallsManifest {
        BlockedSyscallsManifest {
            file: BLOCKED_SYSCALLS.into(),
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

    fn sleep() -> BlockedSyscall {
        BlockedSyscall {
            mono_ns: 457084414274,
            cpu: 1,
            tid: 8193,
            tgid: 8190,
            nr: 0,
            args: [7, 0x7f3a2c001000, 0x10000],
            read_chars: Some(53248),
        }
    }

    #[test]
    fn a_line_reads_back() {
        let line = "457084414274 1 8193 8190 0 0x7 0x7f3a2c001000 0x10000 53248";
        let s = BlockedSyscall::parse(line).unwrap();
        assert_eq!(s, sleep());
        assert_eq!(s.line(), line);
        let max = BlockedSyscall {
            args: [u64::MAX, 0, 1],
            nr: i32::MAX,
            ..sleep()
        };
        assert_eq!(BlockedSyscall::parse(&max.line()).unwrap(), max);
        let uncounted = BlockedSyscall {
            read_chars: None,
            ..sleep()
        };
        assert!(uncounted.line().ends_with(" -"));
        assert_eq!(BlockedSyscall::parse(&uncounted.line()).unwrap(), uncounted);
    }

    #[test]
    fn bad_lines_say_why() {
        for (line, expected) in [
            ("x 1 2 3 0 0x0 0x0 0x0 0", "time"),
            ("1 0 2 3 0 0x0 0x0 0x0", "8 fields, expected 9"),
            ("1 0 2147483648 3 0 0x0 0x0 0x0 0", "tid"),
            ("1 0 2 3 -1 0x0 0x0 0x0 0", "negative"),
            ("1 0 2 3 0 7 0x0 0x0 0", "arg0"),
            ("1 0 2 3 0 0x0 0x 0x0 0", "arg1"),
            ("1 0 2 3 0 0x0 0x0 0x10000000000000000 0", "arg2"),
            ("1 0 2 3 0 0x0 0x0 0x+1 0", "arg2"),
            ("1 0 2 3 0 0x0 0x0 0x1 -5", "rchar"),
        ] {
            let e = BlockedSyscall::parse(line).unwrap_err();
            assert!(e.contains(expected), "{line}: {e}");
        }
    }

    #[test]
    fn a_ring_record_reads_as_the_program_wrote_it() {
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&457084414274u64.to_ne_bytes());
        record[8..12].copy_from_slice(&1u32.to_ne_bytes());
        record[12..16].copy_from_slice(&8193i32.to_ne_bytes());
        record[16..20].copy_from_slice(&8190i32.to_ne_bytes());
        record[20..24].copy_from_slice(&0i32.to_ne_bytes());
        record[24..32].copy_from_slice(&7u64.to_ne_bytes());
        record[32..40].copy_from_slice(&0x7f3a2c001000u64.to_ne_bytes());
        record[40..48].copy_from_slice(&0x10000u64.to_ne_bytes());
        record[48..56].copy_from_slice(&53248u64.to_ne_bytes());
        assert_eq!(BlockedSyscall::from_record(&record), Some(sleep()));
        assert_eq!(BlockedSyscall::from_record(&record[..48]), None);
        // A kernel without the count.
        record[48..56].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(
            BlockedSyscall::from_record(&record),
            Some(BlockedSyscall {
                read_chars: None,
                ..sleep()
            })
        );
    }

    #[test]
    fn the_sink_writes_what_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blocked_syscalls.tsv");
        let mut sink = FileSink::<BlockedSyscall>::create(&path).unwrap();
        sink.push_line(&sleep()).unwrap();
        // Shorter than a record: not one, skipped.
        sink.push(&[0u8; 12]).unwrap();
        let m = BlockedSyscall::section(sink.finish(2).unwrap());
        assert_eq!((m.records, m.lost), (1, 2));
        assert_eq!(read_blocked_syscalls(&path).unwrap(), vec![sleep()]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(HEADER), "{text}");
        // A recorder killed mid-line: the torn line is left out.
        std::fs::write(&path, format!("{text}457084414275 0 81")).unwrap();
        assert_eq!(read_blocked_syscalls(&path).unwrap(), vec![sleep()]);
        // A bad complete line is an error that says which file, which line
        // and why.
        std::fs::write(&path, format!("{text}5 x 42 42 0 0x0 0x0 0x0 0\n")).unwrap();
        let e = read_blocked_syscalls(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 3") && e.contains("cpu") && e.contains("blocked_syscalls.tsv"),
            "{e}"
        );
        // A version 1 file (before the rchar column) still reads; its
        // lines have no count.
        std::fs::write(
            &path,
            "# deepspan blocked syscalls v1: mono_ns cpu tid tgid nr arg0 arg1 arg2\n\
             457084414274 1 8193 8190 0 0x7 0x7f3a2c001000 0x10000\n",
        )
        .unwrap();
        assert_eq!(
            read_blocked_syscalls(&path).unwrap(),
            vec![BlockedSyscall {
                read_chars: None,
                ..sleep()
            }]
        );
        // Another version's file is refused, not misread.
        std::fs::write(
            &path,
            "# deepspan blocked syscalls v3: mono_ns tid nr\n5 42 0\n",
        )
        .unwrap();
        let e = read_blocked_syscalls(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("v3"), "{e}");
        std::fs::write(&path, b"# h\n\xff\n").unwrap();
        let e = read_blocked_syscalls(&path).unwrap_err().to_string();
        assert!(e.contains("not UTF-8 text at byte 4"), "{e}");
    }
}
