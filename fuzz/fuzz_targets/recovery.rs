//! Fuzzes the recovery of a run whose recorder died: the input is what such
//! a recorder may leave behind, its journal files, per-CPU page files and
//! the text files of its eBPF captures of blocked system calls, of
//! socket calls and of switches out of idle (joined by a marker line), made into a run folder.
//! Recovery must finish the run or refuse it with an error, never panic;
//! what it writes must then open and decode like any trace. The capture
//! files are left as the recorder wrote them, and their readers (which
//! drop a torn last line) return lines or an error, never panic.
#![no_main]

use deepspan_ftrace::TraceDat;
use deepspan_record::{BlockedSyscall, IdleSwitch, SocketCall};
use libfuzzer_sys::fuzz_target;

/// Separates the files in an input (seeds are made by joining real files).
const MARKER: &[u8] = b"\n--8<--\n";
const FILES: [&str; 8] = [
    "kernel/journal/recording.json",
    "kernel/journal/trace_meta.json",
    "kernel/journal/clock_samples",
    "kernel/cpu0.raw",
    "kernel/cpu1.raw",
    // Last, so that inputs of fewer files read as before.
    BLOCKED_SYSCALLS,
    SOCKET_CALLS,
    IDLE_SWITCHES,
];
const BLOCKED_SYSCALLS: &str = "kernel/blocked_syscalls.tsv";
const SOCKET_CALLS: &str = "kernel/socket_calls.tsv";
const IDLE_SWITCHES: &str = "kernel/idle_switches.tsv";

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while parts.len() + 1 < FILES.len() {
        match rest.windows(MARKER.len()).position(|w| w == MARKER) {
            Some(at) => {
                parts.push(&rest[..at]);
                rest = &rest[at + MARKER.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let run = dir.path();
    std::fs::create_dir_all(run.join("kernel/journal")).unwrap();
    for (file, bytes) in FILES.iter().zip(split(data)) {
        std::fs::write(run.join(file), bytes).unwrap();
    }
    let blocked = std::fs::read(run.join(BLOCKED_SYSCALLS)).ok();
    let sockets = std::fs::read(run.join(SOCKET_CALLS)).ok();
    let idle = std::fs::read(run.join(IDLE_SWITCHES)).ok();
    let recovered = deepspan_record::recover_from_files(run);
    assert_eq!(
        std::fs::read(run.join(BLOCKED_SYSCALLS)).ok(),
        blocked,
        "recovery leaves the blocked-syscall file as it was"
    );
    assert_eq!(
        std::fs::read(run.join(SOCKET_CALLS)).ok(),
        sockets,
        "recovery leaves the socket-call file as it was"
    );
    assert_eq!(
        std::fs::read(run.join(IDLE_SWITCHES)).ok(),
        idle,
        "recovery leaves the idle-switch file as it was"
    );
    if let Some(bytes) = &idle {
        let read = deepspan_record::read_idle_switches(&run.join(IDLE_SWITCHES)).ok();
        let parsed = std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| deepspan_record::parse_idle_switches(text).ok());
        assert_eq!(read, parsed, "the reader is the parser of the file's text");
        for switch in read.iter().flatten() {
            assert_eq!(
                IdleSwitch::parse(&switch.line()),
                Ok(*switch),
                "a line writes back as it reads"
            );
        }
    }
    if let Some(bytes) = &sockets {
        let read = deepspan_record::read_socket_calls(&run.join(SOCKET_CALLS)).ok();
        let parsed = std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| deepspan_record::parse_socket_calls(text).ok());
        assert_eq!(read, parsed, "the reader is the parser of the file's text");
        for call in read.iter().flatten() {
            assert_eq!(
                SocketCall::parse(&call.line()),
                Ok(*call),
                "a line writes back as it reads"
            );
        }
    }
    if let Some(bytes) = &blocked {
        let read = deepspan_record::read_blocked_syscalls(&run.join(BLOCKED_SYSCALLS)).ok();
        let parsed = std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| deepspan_record::parse_blocked_syscalls(text).ok());
        assert_eq!(read, parsed, "the reader is the parser of the file's text");
        for sleep in read.iter().flatten() {
            assert_eq!(
                BlockedSyscall::parse(&sleep.line()),
                Ok(*sleep),
                "a line writes back as it reads"
            );
        }
    }
    let Ok(recovery) = recovered else {
        return;
    };
    assert!(run.join("manifest.json").is_file());
    assert!(!deepspan_record::needs_recovery(run));
    let Ok(trace) = TraceDat::open(&run.join("kernel/trace.dat")) else {
        return;
    };
    let kept: u64 = recovery.kept_bytes.iter().sum();
    assert_eq!(trace.cpu_data_bytes(), kept, "the trace holds the pages recovery kept");
    let schema = trace.schema().clone();
    if let Ok(records) = trace.records() {
        for record in records.flatten() {
            let _ = record.to_event(&schema);
        }
    }
});
