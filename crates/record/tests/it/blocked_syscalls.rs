//! The blocked-syscall capture against an oracle: the trace's own
//! `raw_syscalls:sys_enter` events, recorded in the same run; and in a
//! flight recorder's window.
//!
//! Threads of this test block, over and over, in three known calls: `read`
//! on a pipe at a distinctive fd, `nanosleep` and `futex` on a known
//! address. For every record of every thread of the host, the thread's
//! last `sys_enter` before the record (with the call's `sys_exit` after it
//! and no other call between) must name the same call with the same first
//! three arguments; the workload's three calls must each be among those
//! compared. The kernel may lose events on a loaded machine: a record is
//! compared only when its call is whole in the trace, with no lost-event
//! mark on any CPU between the call's entry and exit. Each of the three
//! calls repeats hundreds of times, so each must be compared at least once
//! whatever the kernel drops.
//!
//! The bytes read so far (`rchar`) against the same oracle: between two
//! records of one of the workload's threads, the count grows by what the
//! thread's read-like calls returned in the trace between them, when no
//! event was lost in between (nor outside the trace). The reader reads one byte at a time, so
//! every one of its calls counts.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepspan_model::EventKind;
use deepspan_record::{clock_sample, read_blocked_syscalls, record, BlockedSyscall, RecordOptions};
use deepspan_run::Manifest;

use crate::kernel::{flight_window, kernel, switches_flight_recorder, Sweep};

/// The pipe's read end, at an fd number nothing else of this process has.
const PIPE_FD: i32 = 777;
/// How long each blocking call of the workload waits.
const WAIT: Duration = Duration::from_millis(3);
/// The futex word the futex thread waits on (never woken: its wait times
/// out).
static FUTEX_WORD: AtomicU32 = AtomicU32::new(0);

/// A call of one thread in the trace: its entry, and its exit when the
/// trace holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    Enter { ts: u64, id: i64, args: [u64; 3] },
    Exit { ts: u64, id: i64, ret: i64 },
}

impl Call {
    pub(crate) fn ts(&self) -> u64 {
        match *self {
            Call::Enter { ts, .. } | Call::Exit { ts, .. } => ts,
        }
    }
}

pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The workload's threads, blocking until `stop`; their tids and the
/// nanosleep timespec's address.
struct Workload {
    stop: Arc<AtomicBool>,
    tids: Arc<Mutex<Vec<i32>>>,
    nanosleep_ts: Arc<Mutex<u64>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workload {
    fn start() -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let tids = Arc::new(Mutex::new(Vec::new()));
        let nanosleep_ts = Arc::new(Mutex::new(0));
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 made both, and nothing else owns them.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: dup3 onto an fd number nothing of this process uses.
        let fd = unsafe { libc::dup3(read_end.as_raw_fd(), PIPE_FD, libc::O_CLOEXEC) };
        assert_eq!(fd, PIPE_FD, "dup3: {}", std::io::Error::last_os_error());
        // SAFETY: dup3 made it, and nothing else owns it.
        let reader_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        drop(read_end);

        let mut threads = Vec::new();
        let spawn = |threads: &mut Vec<_>, body: Box<dyn FnOnce() + Send>| {
            let tids = tids.clone();
            threads.push(std::thread::spawn(move || {
                tids.lock().unwrap().push(gettid());
                body();
            }));
        };
        {
            let stop = stop.clone();
            spawn(
                &mut threads,
                Box::new(move || {
                    let mut buf = [0u8; 64];
                    // Blocks until the writer's next byte; ends at its EOF.
                    loop {
                        // SAFETY: buf is valid for its length.
                        let n = unsafe {
                            libc::read(reader_fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                        };
                        if n <= 0 || stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                }),
            );
        }
        {
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(WAIT);
                    // SAFETY: writes one byte from a valid buffer.
                    let _ = unsafe { libc::write(write_end.as_raw_fd(), b"x".as_ptr().cast(), 1) };
                }
                // Dropping write_end gives the reader its EOF.
            }));
        }
        {
            let stop = stop.clone();
            let address = nanosleep_ts.clone();
            spawn(
                &mut threads,
                Box::new(move || {
                    let ts = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: WAIT.as_nanos() as i64,
                    };
                    *address.lock().unwrap() = &ts as *const _ as u64;
                    while !stop.load(Ordering::Relaxed) {
                        // The nanosleep system call itself: glibc's
                        // nanosleep() calls clock_nanosleep.
                        // SAFETY: ts is valid; no remainder is asked for.
                        unsafe {
                            libc::syscall(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize)
                        };
                    }
                }),
            );
        }
        {
            let stop = stop.clone();
            spawn(
                &mut threads,
                Box::new(move || {
                    let timeout = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: WAIT.as_nanos() as i64,
                    };
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: the word is a static; the timeout is valid.
                        unsafe {
                            libc::syscall(
                                libc::SYS_futex,
                                FUTEX_WORD.as_ptr(),
                                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                                0u32,
                                &timeout as *const libc::timespec,
                            )
                        };
                    }
                }),
            );
        }
        Workload {
            stop,
            tids,
            nanosleep_ts,
            threads,
        }
    }

    fn stop(self) -> (Vec<i32>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("workload thread");
        }
        let tids = self.tids.lock().unwrap().clone();
        let ts = *self.nanosleep_ts.lock().unwrap();
        (tids, ts)
    }
}

/// Each thread's calls in the trace, in time order.
pub(crate) type Calls = HashMap<i32, Vec<Call>>;
/// Stretches of a CPU's lost events: from the last record before the mark
/// to the record that carries it.
pub(crate) type Losses = Vec<(u64, u64)>;

/// The trace's calls and lost-event stretches.
pub(crate) fn calls_and_losses(trace: &std::path::Path) -> (Calls, Losses) {
    let trace = deepspan_ftrace::TraceDat::open(trace).expect("deepspan reads the trace");
    let mut calls = Calls::new();
    let mut losses = Vec::new();
    for cpu in 0..trace.cpus() {
        let mut records = trace.cpu_records(cpu).expect("cpu records");
        let (mut lost, mut last_ts) = (0, 0);
        while let Some(record) = records.next() {
            let record = record.expect("record decodes");
            if records.lost_events() > lost {
                lost = records.lost_events();
                losses.push((last_ts, record.ts));
            }
            last_ts = record.ts;
            let event = record.to_event(trace.schema());
            let call = match event.kind {
                EventKind::SysEnter { id, args, .. } => Call::Enter {
                    ts: event.ts,
                    id,
                    args: [args[0], args[1], args[2]],
                },
                EventKind::SysExit { id, ret, .. } => Call::Exit {
                    ts: event.ts,
                    id,
                    ret,
                },
                _ => continue,
            };
            calls.entry(event.tid).or_default().push(call);
        }
    }
    for c in calls.values_mut() {
        c.sort_by_key(Call::ts);
    }
    (calls, losses)
}

/// The call a record was taken in, when the trace holds it whole: the
/// thread's last entry before the record, followed by that call's exit
/// after it, with no lost events anywhere in between. None when the
/// trace cannot say.
fn call_of(
    sleep: &BlockedSyscall,
    calls: &[Call],
    losses: &[(u64, u64)],
) -> Option<(i64, [u64; 3])> {
    let after = calls.partition_point(|c| c.ts() < sleep.mono_ns);
    let (
        Call::Enter {
            ts: entered,
            id,
            args,
        },
        Some(&Call::Exit {
            ts: exited,
            id: exit_id,
            ..
        }),
    ) = (*calls.get(after.checked_sub(1)?)?, calls.get(after))
    else {
        return None;
    };
    let lost_between = losses
        .iter()
        .any(|&(from, to)| from <= exited && to >= entered);
    (exit_id == id && !lost_between).then_some((id, args))
}

#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn each_sleep_in_a_system_call_names_the_call_the_trace_entered() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let _sweep = Sweep {
        tracefs: tracefs.clone(),
        pids: vec![std::process::id()],
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut opts = RecordOptions::new(&run);
    opts.duration = Some(Duration::from_secs(2));
    // The oracle: the trace's own system-call events.
    opts.events = "analysis".into();
    let workload = Workload::start();
    let summary = record(&opts, &mut |_| {}).expect("record");
    let (tids, nanosleep_ts) = workload.stop();
    assert_eq!(tids.len(), 3, "{tids:?}");

    let manifest = Manifest::load(&run).unwrap();
    assert!(
        manifest
            .events
            .iter()
            .any(|e| e == "raw_syscalls:sys_enter"),
        "the analysis preset traces the calls: {:?}",
        manifest.events
    );
    let section = manifest
        .blocked_syscalls
        .as_ref()
        .unwrap_or_else(|| panic!("no blocked system calls recorded: {:?}", manifest.warnings));
    let sleeps = read_blocked_syscalls(&run.join(&section.file)).expect("read the file");
    assert_eq!(sleeps.len() as u64, section.records);
    assert!(sleeps.iter().all(|s| s.nr >= 0));

    let (calls, losses) = calls_and_losses(&summary.kernel_trace);
    let futex_wait = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64;
    let (mut compared, mut workload_compared, mut mismatches) = (0, 0, Vec::new());
    // Matches per known call: read on the pipe, nanosleep, futex.
    let mut known = [0usize; 3];
    // Every thread of the host, not only the workload's: the capture is
    // for all of them.
    for sleep in &sleeps {
        let thread_calls = calls.get(&sleep.tid).map_or(&[][..], Vec::as_slice);
        let Some((id, args)) = call_of(sleep, thread_calls, &losses) else {
            continue;
        };
        let nr = i64::from(sleep.nr);
        // A successful exec clears the registers that held its arguments
        // (ELF_PLAT_INIT) before it returns: a sleep after that reads
        // zeros. The number stays.
        let exec = [libc::SYS_execve, libc::SYS_execveat].contains(&nr);
        compared += 1;
        if (id, args) != (nr, sleep.args) && !(exec && id == nr) {
            mismatches.push(format!("{sleep:?}: the trace entered {id} {args:x?}"));
            continue;
        }
        if !tids.contains(&sleep.tid) {
            continue;
        }
        workload_compared += 1;
        match (nr, sleep.args) {
            (libc::SYS_read, [fd, _, 64]) if fd == PIPE_FD as u64 => known[0] += 1,
            (libc::SYS_nanosleep, [ts, 0, _]) if ts == nanosleep_ts => known[1] += 1,
            (libc::SYS_futex, [word, op, 0])
                if word == FUTEX_WORD.as_ptr() as u64 && op == futex_wait =>
            {
                known[2] += 1
            }
            _ => {}
        }
    }
    let (reads_compared, read_mismatches) =
        read_chars_against_the_trace(&sleeps, &tids, &calls, &losses);
    let seconds = (manifest.end.mono_ns - manifest.start.mono_ns) as f64 / 1e9;
    eprintln!(
        "blocked syscalls: {} records ({:.0}/s, {} lost to the ring), {compared} compared with the \
         trace ({workload_compared} of the workload's), {} mismatches; the workload's read matched {}, \
         nanosleep {}, futex {}; {} lost-event stretches in the trace; {reads_compared} rchar \
         differences compared",
        sleeps.len(),
        sleeps.len() as f64 / seconds,
        section.lost,
        mismatches.len(),
        known[0],
        known[1],
        known[2],
        losses.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {compared}: {mismatches:#?}",
        mismatches.len()
    );
    assert!(
        read_mismatches.is_empty(),
        "{} of {reads_compared} rchar differences: {read_mismatches:#?}",
        read_mismatches.len()
    );
    assert!(
        reads_compared > 0,
        "no two records of the reader's sleeps had the trace whole between them"
    );
    for (n, call) in known
        .iter()
        .zip(["read on the pipe", "nanosleep", "futex on the word"])
    {
        assert!(
            *n > 0,
            "no record of the workload's {call} matched the trace (compared {compared})"
        );
    }
}

/// The system calls whose return the kernel adds to a thread's `rchar`
/// (fs/read_write.c: vfs_read, vfs_readv, sendfile, copy_file_range).
const READ_LIKE: [i64; 7] = [
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_sendfile,
    libc::SYS_copy_file_range,
];

/// Compares, for each pair of consecutive records of a thread of `tids`
/// that read something between them, the growth of `rchar` with the
/// trace's read-like returns between the two records. Returns the pairs
/// compared and the mismatches.
fn read_chars_against_the_trace(
    sleeps: &[BlockedSyscall],
    tids: &[i32],
    calls: &Calls,
    losses: &Losses,
) -> (usize, Vec<String>) {
    let (mut compared, mut mismatches) = (0, Vec::new());
    for &tid in tids {
        let ours: Vec<&BlockedSyscall> = sleeps.iter().filter(|s| s.tid == tid).collect();
        let thread_calls = calls.get(&tid).map_or(&[][..], Vec::as_slice);
        for pair in ours.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (Some(from), Some(to)) = (a.read_chars, b.read_chars) else {
                mismatches.push(format!("no rchar in {a:?} or {b:?}"));
                continue;
            };
            // The capture starts before the trace does and ends after it;
            // and the trace may lose events.
            let traced_since = thread_calls.first().map_or(u64::MAX, Call::ts);
            let traced_until = thread_calls.last().map_or(0, Call::ts);
            if a.mono_ns < traced_since
                || b.mono_ns > traced_until
                || losses
                    .iter()
                    .any(|&(l0, l1)| l0 <= b.mono_ns && l1 >= a.mono_ns)
            {
                continue;
            }
            let returned: i64 = thread_calls
                .iter()
                .filter_map(|c| match *c {
                    Call::Exit { ts, id, ret }
                        if ts > a.mono_ns
                            && ts <= b.mono_ns
                            && ret > 0
                            && READ_LIKE.contains(&id) =>
                    {
                        Some(ret)
                    }
                    _ => None,
                })
                .sum();
            if returned == 0 && to == from {
                continue;
            }
            compared += 1;
            if to.checked_sub(from) != Some(returned as u64) {
                mismatches.push(format!(
                    "thread {tid}: rchar {from} at {} and {to} at {}, the trace's reads returned {returned}",
                    a.mono_ns, b.mono_ns
                ));
            }
        }
    }
    (compared, mismatches)
}

/// A flight recorder window holds the sleeps in system calls of its time
/// (kept in memory between windows): a thread of this test sleeps in
/// `nanosleep` on a known timespec, over and over, inside the window.
#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn flight_recorder_windows_hold_the_sleeps_in_system_calls() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let (_sweep, mut flight) = switches_flight_recorder(&tracefs);
    let start = clock_sample()[1];
    let (tid, address) = std::thread::spawn(|| {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: WAIT.as_nanos() as i64,
        };
        for _ in 0..30 {
            // SAFETY: ts is valid; no remainder is asked for.
            unsafe { libc::syscall(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize) };
        }
        (gettid(), &ts as *const _ as u64)
    })
    .join()
    .unwrap();
    let end = clock_sample()[1];
    let (dir, manifest) = flight_window(&mut flight, start, end);
    let section = manifest
        .blocked_syscalls
        .unwrap_or_else(|| panic!("no blocked system calls recorded: {:?}", manifest.warnings));
    let sleeps = read_blocked_syscalls(&dir.path().join(&section.file)).expect("read");
    assert_eq!(sleeps.len() as u64, section.records);
    assert!(
        sleeps.iter().all(|s| s.mono_ns <= end),
        "none after the window"
    );
    let ours = sleeps
        .iter()
        .filter(|s| s.tid == tid && i64::from(s.nr) == libc::SYS_nanosleep)
        .collect::<Vec<_>>();
    assert!(
        ours.iter()
            .any(|s| s.args[0] == address && (start..=end).contains(&s.mono_ns)),
        "none of the {} records holds the thread's nanosleep: {ours:?}",
        sleeps.len()
    );
    flight.stop().expect("stop");
}
