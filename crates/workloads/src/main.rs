//! `deepspan-workload`: small real programs that tests and benchmarks record.
//!
//! Each prints one JSON line describing itself (thread ids by role, counts)
//! so a test can look for exactly those threads in the kernel trace.
//!
//! - `mt`: threads that sleep, contend on one mutex, and do disk I/O;
//! - `pingpong N [PAUSE_US]`: two threads passing a byte over pipes N
//!   times (context-switch heavy), the first sleeping PAUSE_US between
//!   rounds when given (a steady, lighter load whose trace stays small);
//! - `syscalls N`: N cheap system calls (syscall heavy, few switches);
//! - `hot ROUNDS SPANS.json`: one CPU-bound request (a hot function, a
//!   sleep, the hot function again), written as an OTLP JSON span with
//!   deepspan's thread and monotonic-time attributes, for CPU profiles;
//! - `rpc-server ADDR SPANS.json` and `rpc-client ADDR SPANS.json N`: a
//!   client that makes N calls over one TCP connection to a server that
//!   computes, sleeps and computes again for each; both write their spans
//!   (the client's job and call, the server's handling) as OTLP JSON with
//!   deepspan's fields, for analyses across hosts (network namespaces).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: deepspan-workload mt [DIR] | pingpong ROUNDS [PAUSE_US] | syscalls COUNT | hot ROUNDS SPANS.json \
         | rpc-server ADDR SPANS.json | rpc-client ADDR SPANS.json CALLS"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("mt") => mt(args
            .get(1)
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)),
        Some("pingpong") => {
            let pause_us = match args.get(2).map(|p| p.parse()) {
                None => Ok(0),
                Some(p) => p,
            };
            match (args.get(1).and_then(|n| n.parse().ok()), pause_us) {
                (Some(rounds), Ok(pause_us)) => pingpong(rounds, Duration::from_micros(pause_us)),
                _ => return usage(),
            }
        }
        Some("syscalls") => match args.get(1).and_then(|n| n.parse().ok()) {
            Some(count) => syscalls(count),
            None => return usage(),
        },
        Some("hot") => match (args.get(1).and_then(|n| n.parse().ok()), args.get(2)) {
            (Some(rounds), Some(out)) => hot(rounds, PathBuf::from(out)),
            _ => return usage(),
        },
        Some("rpc-server") => match (args.get(1), args.get(2)) {
            (Some(addr), Some(out)) => rpc_server(addr, PathBuf::from(out)),
            _ => return usage(),
        },
        Some("rpc-client") => match (
            args.get(1),
            args.get(2),
            args.get(3).and_then(|n| n.parse().ok()),
        ) {
            (Some(addr), Some(out), Some(calls)) => rpc_client(addr, PathBuf::from(out), calls),
            _ => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deepspan-workload: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long the lock holder keeps the mutex; long enough that the waiter
/// really blocks in futex (not just spins) on a busy 2-core machine.
const HOLD: Duration = Duration::from_millis(30);
const SLEEP: Duration = Duration::from_millis(20);

fn mt(dir: PathBuf) -> std::io::Result<()> {
    let lock = Arc::new(Mutex::new(0u64));
    let start = Arc::new(Barrier::new(4));
    let main_tid = gettid();

    let sleeper = {
        let start = start.clone();
        thread::Builder::new()
            .name("ds-sleeper".into())
            .spawn(move || {
                start.wait();
                for _ in 0..5 {
                    thread::sleep(SLEEP);
                }
                gettid()
            })?
    };
    // The holder takes the lock first and keeps it while the waiter asks.
    let (holder, waiter) = {
        let (taken_tx, taken_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let (lock, start) = (lock.clone(), start.clone());
            thread::Builder::new()
                .name("ds-holder".into())
                .spawn(move || {
                    start.wait();
                    for _ in 0..3 {
                        let mut guard = lock.lock().unwrap();
                        let _ = taken_tx.send(());
                        spin(HOLD);
                        *guard += 1;
                        drop(guard);
                        thread::sleep(Duration::from_millis(5));
                    }
                    gettid()
                })?
        };
        let waiter = {
            let (lock, start) = (lock.clone(), start.clone());
            thread::Builder::new()
                .name("ds-waiter".into())
                .spawn(move || {
                    start.wait();
                    for _ in 0..3 {
                        let _ = taken_rx.recv();
                        *lock.lock().unwrap() += 1;
                    }
                    gettid()
                })?
        };
        (holder, waiter)
    };
    start.wait();
    let io_path = dir.join(format!("deepspan-workload-{}.bin", std::process::id()));
    let io_result = disk_io(&io_path);
    let _ = fs::remove_file(&io_path);
    io_result?;

    let sleeper = sleeper.join().expect("sleeper thread panicked");
    let holder = holder.join().expect("holder thread panicked");
    let waiter = waiter.join().expect("waiter thread panicked");
    println!(
        "{{\"workload\":\"mt\",\"pid\":{},\"main\":{main_tid},\"sleeper\":{sleeper},\"holder\":{holder},\"waiter\":{waiter},\"io\":{main_tid}}}",
        std::process::id()
    );
    Ok(())
}

/// Busy work that holds the CPU (and the lock) without system calls.
fn spin(d: Duration) {
    let until = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < until {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        std::hint::black_box(x);
    }
}

/// Writes, fsyncs and reads back a file with O_DIRECT so the block layer
/// really sees requests (the page cache would hide reads otherwise).
fn disk_io(path: &PathBuf) -> std::io::Result<()> {
    const BLOCK: usize = 1 << 20;
    let data = vec![0x5au8; BLOCK];
    let mut f = File::create(path)?;
    for _ in 0..4 {
        f.write_all(&data)?;
    }
    f.sync_all()?;
    drop(f);
    let mut buf = AlignedBuf::new(BLOCK);
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(mut f) => {
            for i in 0..4u64 {
                f.seek(SeekFrom::Start(i * BLOCK as u64))?;
                f.read_exact(buf.as_mut_slice())?;
            }
        }
        // tmpfs and some overlays refuse O_DIRECT; fall back to a cached read.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            File::open(path)?.read_to_end(&mut Vec::new())?;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A page-aligned buffer, as O_DIRECT requires.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedBuf { ptr, len }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("valid layout");
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

fn pingpong(rounds: u64, pause: Duration) -> std::io::Result<()> {
    let (mut a_read, mut b_write) = pipe()?;
    let (mut b_read, mut a_write) = pipe()?;
    let started = Instant::now();
    let peer = thread::spawn(move || -> std::io::Result<i32> {
        let mut byte = [0u8];
        for _ in 0..rounds {
            b_read.read_exact(&mut byte)?;
            b_write.write_all(&byte)?;
        }
        Ok(gettid())
    });
    let mut byte = [1u8];
    for _ in 0..rounds {
        a_write.write_all(&byte)?;
        a_read.read_exact(&mut byte)?;
        if !pause.is_zero() {
            thread::sleep(pause);
        }
    }
    let peer_tid = peer.join().expect("peer thread panicked")?;
    println!(
        "{{\"workload\":\"pingpong\",\"pid\":{},\"tids\":[{},{peer_tid}],\"rounds\":{rounds},\"seconds\":{:.6},\"cpu_seconds\":{:.6}}}",
        std::process::id(),
        gettid(),
        started.elapsed().as_secs_f64(),
        cpu_seconds()
    );
    Ok(())
}

fn pipe() -> std::io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// CPU time (user + system) this process has used so far, in seconds.
/// Benchmarks prefer it to wall time: on a shared 2-core machine other
/// processes stretch wall time, while tracing cost is charged here as
/// system time of the traced thread itself.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn syscalls(count: u64) -> std::io::Result<()> {
    let started = Instant::now();
    for _ in 0..count {
        // SAFETY: getppid has no preconditions; the raw syscall avoids libc caching.
        std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
    }
    println!(
        "{{\"workload\":\"syscalls\",\"pid\":{},\"count\":{count},\"seconds\":{:.6},\"cpu_seconds\":{:.6}}}",
        std::process::id(),
        started.elapsed().as_secs_f64(),
        cpu_seconds()
    );
    Ok(())
}

/// The hot function of `hot`: integer mixing with no calls and no memory
/// traffic, so every sample taken in it has it as its leaf frame.
#[inline(never)]
fn spin_hot(rounds: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..rounds {
        x = std::hint::black_box(x.rotate_left(7) ^ i).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    }
    x
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn hot(rounds: u64, out: PathBuf) -> std::io::Result<()> {
    let (wall_start, mono_start) = (
        clock_ns(libc::CLOCK_REALTIME),
        clock_ns(libc::CLOCK_MONOTONIC),
    );
    let cpu_start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let a = spin_hot(rounds);
    thread::sleep(Duration::from_millis(50));
    let b = spin_hot(rounds);
    let (wall_end, mono_end) = (
        clock_ns(libc::CLOCK_REALTIME),
        clock_ns(libc::CLOCK_MONOTONIC),
    );
    let cpu_ns = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - cpu_start;
    let tid = gettid();
    let trace_id = format!("{:016x}{:016x}", mono_start, std::process::id());
    let span_id = format!("{:016x}", mono_start ^ 0x5a5a);
    let int_attr =
        |k: &str, v: u64| format!("{{\"key\":\"{k}\",\"value\":{{\"intValue\":\"{v}\"}}}}");
    let span = format!(
        "{{\"resourceSpans\":[{{\"resource\":{{\"attributes\":[{{\"key\":\"service.name\",\"value\":{{\"stringValue\":\"workload\"}}}},{pid}]}},\
\"scopeSpans\":[{{\"spans\":[{{\"traceId\":\"{trace_id}\",\"spanId\":\"{span_id}\",\"name\":\"GET /hot\",\"kind\":2,\
\"startTimeUnixNano\":\"{wall_start}\",\"endTimeUnixNano\":\"{wall_end}\",\"attributes\":[{tid},{ms},{me}]}}]}}]}}]}}\n",
        pid = int_attr("process.pid", u64::from(std::process::id())),
        tid = int_attr("deepspan.tid", tid as u64),
        ms = int_attr("deepspan.mono_start_ns", mono_start),
        me = int_attr("deepspan.mono_end_ns", mono_end),
    );
    fs::write(&out, span)?;
    println!(
        "{{\"workload\":\"hot\",\"pid\":{},\"tid\":{tid},\"span_id\":\"{span_id}\",\"hot_function\":\"spin_hot\",\"cpu_ns\":{cpu_ns},\"check\":{}}}",
        std::process::id(),
        a ^ b
    );
    Ok(())
}

/// A span as OTLP JSON: `kind` 1 internal, 2 server, 3 client; times as
/// (wall, monotonic) pairs, the thread as deepspan's `deepspan.tid`.
struct JsonSpan {
    trace_id: String,
    span_id: String,
    parent: Option<String>,
    name: &'static str,
    kind: u32,
    start: (u64, u64),
    end: (u64, u64),
    tid: i32,
}

impl JsonSpan {
    fn to_json(&self) -> String {
        let int_attr =
            |k: &str, v: u64| format!("{{\"key\":\"{k}\",\"value\":{{\"intValue\":\"{v}\"}}}}");
        let parent = self
            .parent
            .as_ref()
            .map(|p| format!("\"parentSpanId\":\"{p}\","))
            .unwrap_or_default();
        format!(
            "{{\"traceId\":\"{}\",\"spanId\":\"{}\",{parent}\"name\":\"{}\",\"kind\":{},\
\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":[{},{},{}]}}",
            self.trace_id,
            self.span_id,
            self.name,
            self.kind,
            self.start.0,
            self.end.0,
            int_attr("deepspan.tid", self.tid as u64),
            int_attr("deepspan.mono_start_ns", self.start.1),
            int_attr("deepspan.mono_end_ns", self.end.1),
        )
    }
}

fn now() -> (u64, u64) {
    (
        clock_ns(libc::CLOCK_REALTIME),
        clock_ns(libc::CLOCK_MONOTONIC),
    )
}

/// Writes `spans` of `service` as one OTLP JSON request.
fn write_spans(out: &PathBuf, service: &str, spans: &[JsonSpan]) -> std::io::Result<()> {
    let list: Vec<String> = spans.iter().map(JsonSpan::to_json).collect();
    let doc = format!(
        "{{\"resourceSpans\":[{{\"resource\":{{\"attributes\":[{{\"key\":\"service.name\",\"value\":{{\"stringValue\":\"{service}\"}}}},\
{{\"key\":\"process.pid\",\"value\":{{\"intValue\":\"{}\"}}}}]}},\"scopeSpans\":[{{\"spans\":[{}]}}]}}]}}\n",
        std::process::id(),
        list.join(",")
    );
    fs::write(out, doc)
}

/// Server CPU work per call, in `spin_hot` rounds (about 0.3 ms here).
const RPC_WORK_ROUNDS: u64 = 300_000;
const RPC_SLEEP: Duration = Duration::from_millis(1);

/// Serves one connection: each line `TRACE_ID CLIENT_SPAN_ID` gets a
/// SERVER span (compute, sleep, compute) and the reply `ok`.
fn rpc_server(addr: &str, out: PathBuf) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind(addr)?;
    println!(
        "{{\"workload\":\"rpc-server\",\"pid\":{},\"tid\":{},\"port\":{}}}",
        std::process::id(),
        gettid(),
        listener.local_addr()?.port()
    );
    std::io::stdout().flush()?;
    let (stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let mut reply = stream.try_clone()?;
    let mut spans = Vec::new();
    let mut check = 0u64;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let start = now();
        let mut ids = line.split_whitespace();
        let (Some(trace_id), Some(parent)) = (ids.next(), ids.next()) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad call: {line:?}"),
            ));
        };
        check ^= spin_hot(RPC_WORK_ROUNDS);
        thread::sleep(RPC_SLEEP);
        check ^= spin_hot(RPC_WORK_ROUNDS);
        reply.write_all(b"ok\n")?;
        spans.push(JsonSpan {
            trace_id: trace_id.to_string(),
            span_id: format!("{:016x}", start.1 ^ 0x5e57e5),
            parent: Some(parent.to_string()),
            name: "handle",
            kind: 2,
            start,
            end: now(),
            tid: gettid(),
        });
    }
    std::hint::black_box(check);
    write_spans(&out, "rpc-server", &spans)
}

/// Connects, waits for a line on stdin (so recordings can start first),
/// then makes `calls` calls, each a root `job` span with a CLIENT `call`
/// span around the request and its reply.
fn rpc_client(addr: &str, out: PathBuf, calls: u64) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader};
    let stream = std::net::TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let mut request = stream.try_clone()?;
    let mut replies = BufReader::new(stream);
    println!(
        "{{\"workload\":\"rpc-client\",\"pid\":{},\"tid\":{}}}",
        std::process::id(),
        gettid()
    );
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let mut spans = Vec::new();
    let mut check = 0u64;
    for i in 0..calls {
        let job_start = now();
        let trace_id = format!(
            "{:016x}{:016x}",
            job_start.1,
            u64::from(std::process::id()) << 32 | i
        );
        let job_id = format!("{:016x}", job_start.1 ^ 0x10b);
        check ^= spin_hot(RPC_WORK_ROUNDS / 4);
        let call_start = now();
        let call_id = format!("{:016x}", call_start.1 ^ 0xca11);
        request.write_all(format!("{trace_id} {call_id}\n").as_bytes())?;
        let mut reply = String::new();
        if replies.read_line(&mut reply)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server hung up",
            ));
        }
        let call_end = now();
        check ^= spin_hot(RPC_WORK_ROUNDS / 4);
        let tid = gettid();
        spans.push(JsonSpan {
            trace_id: trace_id.clone(),
            span_id: call_id,
            parent: Some(job_id.clone()),
            name: "call",
            kind: 3,
            start: call_start,
            end: call_end,
            tid,
        });
        spans.push(JsonSpan {
            trace_id,
            span_id: job_id,
            parent: None,
            name: "job",
            kind: 2,
            start: job_start,
            end: now(),
            tid,
        });
        thread::sleep(Duration::from_millis(2));
    }
    std::hint::black_box(check);
    drop(request);
    write_spans(&out, "rpc-client", &spans)
}
