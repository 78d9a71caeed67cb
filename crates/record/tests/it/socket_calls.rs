//! The socket-call capture against an oracle: the trace's own
//! `raw_syscalls:sys_enter`/`sys_exit` events, recorded in the same run
//! (the `analysis` preset); and in a flight recorder's window.
//!
//! Threads of this test exchange requests and responses over two
//! connections, TCP on loopback and a Unix stream pair, turn by turn with
//! each of the calls that reach a socket: `sendto`, `sendmsg` and `write`
//! to send, `recvfrom`, `recvmsg` and `read` to receive (until the whole
//! message is in; a read at the peer's end returns 0). For every thread of
//! this process, each such call that the trace holds whole (its entry and
//! exit, with no lost-event mark on any CPU between them) is compared with
//! the records of its thread inside it, with no tolerance:
//! - a receive that returned n > 0 bytes holds exactly one record, a
//!   `recv` of n bytes; one that returned 0 or an error holds none;
//! - a send that returned n > 0 holds exactly one record, a `send` of n
//!   bytes, and n is the length asked (the `len`/`count` argument; for
//!   `sendmsg`, the message's length, which the sending thread knows): the
//!   workload's sends block until all is sent; one that returned 0 or an
//!   error holds none (the capture takes a send at its end, see
//!   `bpf/socket_calls.bpf.c`);
//! - any other call holds none;
//! - a record on one of the workload's sockets names that socket: the
//!   cookie `getsockopt(SO_COOKIE)` gives this test, and for TCP the ports
//!   of its end of the connection (for the Unix pair, none).
//!
//! And every record of these threads must lie inside such a call: one
//! between two calls, or inside another call, is a mismatch, unless the
//! trace cannot say (a lost-event mark between the thread's events around
//! it, or before its first traced event or after its last).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepspan_model::Socket;
use deepspan_record::{clock_sample, read_socket_calls, record, RecordOptions, SocketCall};
use deepspan_run::Manifest;

use crate::blocked_syscalls::{calls_and_losses, gettid, Call, Losses};
use crate::kernel::{flight_window, kernel, switches_flight_recorder, Sweep};

/// Bytes of a request and of a response.
const REQUEST: usize = 100;
const RESPONSE: usize = 1500;
/// The client's pause between exchanges.
const PACE: Duration = Duration::from_micros(500);

/// `SO_COOKIE` of asm-generic/socket.h (x86_64 and arm64 alike).
const SO_COOKIE: i32 = 57;

/// The socket `fd` is, as the capture names it: its cookie, and the ports
/// of an IPv4 TCP socket.
fn socket_of(fd: i32, tcp: Option<(&std::net::SocketAddr, &std::net::SocketAddr)>) -> Socket {
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: cookie and len are valid for the size given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "SO_COOKIE: {}", std::io::Error::last_os_error());
    let (local_port, remote_port) = tcp.map_or((0, 0), |(l, r)| (l.port(), r.port()));
    Socket {
        cookie,
        local_port,
        remote_port,
    }
}

/// How a thread sends or receives, turn by turn.
#[derive(Clone, Copy, Debug)]
enum Way {
    /// sendto / recvfrom.
    To,
    /// sendmsg / recvmsg, the buffer in two parts.
    Msg,
    /// write / read.
    Plain,
}

const WAYS: [Way; 3] = [Way::To, Way::Msg, Way::Plain];

fn check(n: isize, what: &str) -> usize {
    assert!(n >= 0, "{what}: {}", std::io::Error::last_os_error());
    n as usize
}

/// Sends all of `buf` on `fd` in one call.
fn send(fd: i32, buf: &[u8], way: Way) {
    let n = match way {
        // SAFETY: buf is valid for its length; no address.
        Way::To => unsafe {
            libc::sendto(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
                std::ptr::null(),
                0,
            )
        },
        Way::Msg => {
            let (a, b) = buf.split_at(buf.len() / 3);
            let mut iov = [
                libc::iovec {
                    iov_base: a.as_ptr() as *mut _,
                    iov_len: a.len(),
                },
                libc::iovec {
                    iov_base: b.as_ptr() as *mut _,
                    iov_len: b.len(),
                },
            ];
            // SAFETY: zeroed is a valid msghdr (no name, no control).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len();
            // SAFETY: msg points at valid buffers.
            unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) }
        }
        // SAFETY: buf is valid for its length.
        Way::Plain => unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) },
    };
    assert_eq!(check(n, "send"), buf.len(), "a blocking send sends it all");
}

/// One receive into `buf`: what it returned.
fn recv_once(fd: i32, buf: &mut [u8], way: Way) -> usize {
    let n = match way {
        // SAFETY: buf is valid for its length; no address asked.
        Way::To => unsafe {
            libc::recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        },
        Way::Msg => {
            let half = buf.len() / 2;
            let (a, b) = buf.split_at_mut(half);
            let mut iov = [
                libc::iovec {
                    iov_base: a.as_mut_ptr().cast(),
                    iov_len: a.len(),
                },
                libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                },
            ];
            // SAFETY: zeroed is a valid msghdr (no name, no control).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len();
            // SAFETY: msg points at valid buffers.
            unsafe { libc::recvmsg(fd, &mut msg, 0) }
        }
        // SAFETY: buf is valid for its length.
        Way::Plain => unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) },
    };
    check(n, "receive")
}

/// Receives `len` bytes, in as many calls as it takes; false at the
/// peer's end.
fn recv_all(fd: i32, len: usize, way: Way) -> bool {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match recv_once(fd, &mut buf[got..], way) {
            0 => return false,
            n => got += n,
        }
    }
    true
}

/// The workload: per connection a client thread and a server thread.
struct Workload {
    stop: Arc<AtomicBool>,
    /// Each workload thread's tid and the length of its sends.
    senders: Arc<Mutex<HashMap<i32, u64>>>,
    /// The connections' fds, and the socket each is.
    sockets: HashMap<i32, Socket>,
    threads: Vec<std::thread::JoinHandle<usize>>,
    _keep: Vec<Box<dyn AsRawFd + Send>>,
}

impl Workload {
    fn start() -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let senders = Arc::new(Mutex::new(HashMap::new()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp_client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (tcp_server, _) = listener.accept().unwrap();
        tcp_client.set_nodelay(true).unwrap();
        tcp_server.set_nodelay(true).unwrap();
        let (unix_client, unix_server) = UnixStream::pair().unwrap();
        let sockets = HashMap::from([
            (
                tcp_client.as_raw_fd(),
                socket_of(
                    tcp_client.as_raw_fd(),
                    Some((
                        &tcp_client.local_addr().unwrap(),
                        &tcp_client.peer_addr().unwrap(),
                    )),
                ),
            ),
            (
                tcp_server.as_raw_fd(),
                socket_of(
                    tcp_server.as_raw_fd(),
                    Some((
                        &tcp_server.local_addr().unwrap(),
                        &tcp_server.peer_addr().unwrap(),
                    )),
                ),
            ),
            (
                unix_client.as_raw_fd(),
                socket_of(unix_client.as_raw_fd(), None),
            ),
            (
                unix_server.as_raw_fd(),
                socket_of(unix_server.as_raw_fd(), None),
            ),
        ]);
        let pairs = [
            (tcp_client.as_raw_fd(), tcp_server.as_raw_fd()),
            (unix_client.as_raw_fd(), unix_server.as_raw_fd()),
        ];
        let mut threads = Vec::new();
        for (client, server) in pairs {
            let (stop_c, senders_c) = (stop.clone(), senders.clone());
            threads.push(std::thread::spawn(move || {
                senders_c.lock().unwrap().insert(gettid(), REQUEST as u64);
                let request = [b'q'; REQUEST];
                let mut turns = 0;
                while !stop_c.load(Ordering::Relaxed) {
                    std::thread::sleep(PACE);
                    send(client, &request, WAYS[turns % 3]);
                    assert!(recv_all(client, RESPONSE, WAYS[(turns / 3) % 3]));
                    turns += 1;
                }
                // The server's next receive returns 0.
                // SAFETY: shuts down the write side of a socket this owns.
                unsafe { libc::shutdown(client, libc::SHUT_WR) };
                turns
            }));
            let senders_s = senders.clone();
            threads.push(std::thread::spawn(move || {
                senders_s.lock().unwrap().insert(gettid(), RESPONSE as u64);
                let response = [b'r'; RESPONSE];
                let mut turns = 0;
                while recv_all(server, REQUEST, WAYS[(turns / 3) % 3]) {
                    send(server, &response, WAYS[turns % 3]);
                    turns += 1;
                }
                turns
            }));
        }
        Workload {
            stop,
            senders,
            sockets,
            threads,
            _keep: vec![
                Box::new(tcp_client),
                Box::new(tcp_server),
                Box::new(unix_client),
                Box::new(unix_server),
                Box::new(listener),
            ],
        }
    }

    /// Stops the threads: each thread's send length, and the exchanges
    /// made.
    fn stop(self) -> (HashMap<i32, u64>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let turns = self
            .threads
            .into_iter()
            .map(|t| t.join().expect("workload thread"))
            .sum();
        let senders = self.senders.lock().unwrap().clone();
        (senders, turns)
    }
}

/// What a socket call must hold: a `recv` of n bytes, a `send` of n bytes
/// (and the length it was asked to send, when known), or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Recv(u64),
    Send(u64, Option<u64>),
    Nothing,
}

/// A call of a thread, whole in the trace.
#[derive(Debug)]
struct WholeCall {
    entered: u64,
    exited: u64,
    id: i64,
    args: [u64; 3],
    ret: i64,
}

/// The thread's calls that the trace holds whole, with no lost events
/// between their entry and exit.
fn whole_calls(calls: &[Call], losses: &Losses) -> Vec<WholeCall> {
    calls
        .windows(2)
        .filter_map(|w| match (w[0], w[1]) {
            (
                Call::Enter {
                    ts: entered,
                    id,
                    args,
                },
                Call::Exit {
                    ts: exited,
                    id: exit_id,
                    ret,
                },
            ) if id == exit_id => Some(WholeCall {
                entered,
                exited,
                id,
                args,
                ret,
            }),
            _ => None,
        })
        .filter(|c| {
            !losses
                .iter()
                .any(|&(from, to)| from <= c.exited && to >= c.entered)
        })
        .collect()
}

/// What `call` must hold; `sockets` are the fds whose read and write reach
/// a socket, `send_len` the length of the thread's sendmsg messages.
fn expected(call: &WholeCall, sockets: &HashMap<i32, Socket>, send_len: Option<u64>) -> Expected {
    let on_socket = sockets.keys().any(|&fd| fd as u64 == call.args[0]);
    let received = match call.ret {
        n if n > 0 => Expected::Recv(n as u64),
        _ => Expected::Nothing,
    };
    let sent = |asked: Option<u64>| match call.ret {
        n if n > 0 => Expected::Send(n as u64, asked),
        _ => Expected::Nothing,
    };
    match call.id {
        libc::SYS_recvfrom | libc::SYS_recvmsg => received,
        libc::SYS_read if on_socket => received,
        libc::SYS_sendto => sent(Some(call.args[2])),
        libc::SYS_write if on_socket => sent(Some(call.args[2])),
        libc::SYS_sendmsg => sent(send_len),
        _ => Expected::Nothing,
    }
}

/// Compares one thread's records with its calls in the trace: the
/// mismatches, the socket calls compared (by system call number), and the
/// records the trace cannot judge.
fn compare_thread(
    records: &[&SocketCall],
    calls: &[Call],
    losses: &Losses,
    sockets: &HashMap<i32, Socket>,
    send_len: Option<u64>,
) -> (Vec<String>, HashMap<i64, usize>, usize) {
    let whole = whole_calls(calls, losses);
    let mut mismatches = Vec::new();
    let mut compared = HashMap::new();
    let mut inside = vec![false; records.len()];
    for call in &whole {
        let held: Vec<(usize, &SocketCall)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| (call.entered..=call.exited).contains(&r.mono_ns))
            .map(|(i, r)| (i, *r))
            .collect();
        for &(i, _) in &held {
            inside[i] = true;
        }
        let want = expected(call, sockets, send_len);
        if want != Expected::Nothing {
            *compared.entry(call.id).or_default() += 1;
        }
        // The call's socket, when it is one of the workload's: the record
        // must name it.
        let socket = i32::try_from(call.args[0])
            .ok()
            .and_then(|fd| sockets.get(&fd));
        let named = |r: &SocketCall| socket.is_none_or(|s| r.socket.as_ref() == Some(s));
        let ok = held.iter().all(|(_, r)| named(r))
            && match (want, &held[..]) {
                (Expected::Nothing, []) => true,
                (Expected::Recv(n), [(_, r)]) => !r.sent && r.bytes == n,
                (Expected::Send(n, asked), [(_, r)]) => {
                    // A sendmsg of a thread whose message length is not known
                    // here (none of this test's threads) is judged by what it
                    // returned alone.
                    r.sent && r.bytes == n && asked.is_none_or(|asked| asked == n)
                }
                _ => false,
            };
        if !ok {
            mismatches.push(format!("{call:?}: expected {want:?}, holds {held:?}"));
        }
    }
    let mut unjudged = 0;
    for (record, _) in records.iter().zip(&inside).filter(|(_, &i)| !i) {
        // The thread's events around the record; the trace says nothing of
        // a record before the first or after the last, or with events
        // lost between them.
        let after = calls.partition_point(|c| c.ts() < record.mono_ns);
        let (Some(before), Some(next)) = (
            after.checked_sub(1).and_then(|b| calls.get(b)),
            calls.get(after),
        ) else {
            unjudged += 1;
            continue;
        };
        let lost = losses
            .iter()
            .any(|&(from, to)| from <= next.ts() && to >= before.ts());
        if lost {
            unjudged += 1;
            continue;
        }
        mismatches.push(format!(
            "{record:?} lies outside a socket call: between {before:?} and {next:?}"
        ));
    }
    (mismatches, compared, unjudged)
}

#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn each_socket_call_of_the_trace_has_its_record_and_no_other() {
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
    let sockets = workload.sockets.clone();
    let summary = record(&opts, &mut |_| {}).expect("record");
    let (senders, turns) = workload.stop();
    assert_eq!(senders.len(), 4, "{senders:?}");

    let manifest = Manifest::load(&run).unwrap();
    for event in ["raw_syscalls:sys_enter", "raw_syscalls:sys_exit"] {
        assert!(
            manifest.events.iter().any(|e| e == event),
            "the analysis preset traces the calls: {:?}",
            manifest.events
        );
    }
    let section = manifest
        .socket_calls
        .as_ref()
        .unwrap_or_else(|| panic!("no socket calls recorded: {:?}", manifest.warnings));
    assert_eq!(section.file, "kernel/socket_calls.tsv");
    let records = read_socket_calls(&run.join(&section.file)).expect("read the file");
    assert_eq!(records.len() as u64, section.records);
    assert!(records.iter().all(|r| r.sent || r.bytes > 0));

    let (calls, losses) = calls_and_losses(&summary.kernel_trace);
    let pid = std::process::id() as i32;
    let mut by_tid: HashMap<i32, Vec<&SocketCall>> = HashMap::new();
    for r in records.iter().filter(|r| r.tgid == pid) {
        by_tid.entry(r.tid).or_default().push(r);
    }
    // Every thread of this process: those the recorder saw (its
    // `tid tgid` lines), the workload's, and any with a record.
    let saved = std::fs::read_to_string(run.join("kernel/saved_tgids")).expect("saved_tgids");
    let mut tids: Vec<i32> = saved
        .lines()
        .filter_map(|l| {
            let (tid, tgid) = l.split_once(' ')?;
            (tgid.trim().parse() == Ok(pid)).then(|| tid.parse().ok())?
        })
        .chain(senders.keys().copied())
        .chain(by_tid.keys().copied())
        .collect();
    tids.sort_unstable();
    tids.dedup();
    let (mut mismatches, mut compared, mut unjudged) = (Vec::new(), 0, 0);
    let (mut workload_compared, mut by_call) = (0, HashMap::<i64, usize>::new());
    for tid in &tids {
        let thread_records = by_tid.get(tid).map_or(&[][..], Vec::as_slice);
        let thread_calls = calls.get(tid).map_or(&[][..], Vec::as_slice);
        let (m, c, u) = compare_thread(
            thread_records,
            thread_calls,
            &losses,
            &sockets,
            senders.get(tid).copied(),
        );
        mismatches.extend(m.into_iter().map(|m| format!("tid {tid}: {m}")));
        let c_sum: usize = c.values().sum();
        compared += c_sum;
        unjudged += u;
        if senders.contains_key(tid) {
            workload_compared += c_sum;
            for (id, n) in c {
                *by_call.entry(id).or_default() += n;
            }
        }
    }
    let seconds = (manifest.end.mono_ns - manifest.start.mono_ns) as f64 / 1e9;
    eprintln!(
        "socket calls: {} records ({:.0}/s, {} lost to the ring), {} of this process; {turns} \
         exchanges; {compared} socket calls compared with the trace ({workload_compared} of the \
         workload's: {by_call:?} by call number), {} mismatches, {unjudged} records the trace \
         cannot judge (before or after it, or with events lost); {} lost-event stretches in the \
         trace",
        records.len(),
        records.len() as f64 / seconds,
        section.lost,
        by_tid.values().map(Vec::len).sum::<usize>(),
        mismatches.len(),
        losses.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {compared}: {mismatches:#?}",
        mismatches.len()
    );
    // Each client and server made hundreds of exchanges, with each way of
    // sending and receiving: whatever the kernel drops, most are compared.
    assert!(
        workload_compared >= turns,
        "only {workload_compared} of the workload's calls compared ({turns} exchanges)"
    );
    for (id, call) in [
        (libc::SYS_recvfrom, "recvfrom"),
        (libc::SYS_recvmsg, "recvmsg"),
        (libc::SYS_read, "read"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_sendmsg, "sendmsg"),
        (libc::SYS_write, "write"),
    ] {
        assert!(
            by_call.get(&id).is_some_and(|&n| n > 0),
            "no {call} of the workload compared: {by_call:?}"
        );
    }
}

/// A flight recorder window holds the socket calls of its time (kept in
/// memory between windows): a thread of this test sends on a Unix stream
/// pair, and another receives, inside the window.
#[test]
#[ignore = "system: root, tracefs, BPF and BTF"]
fn flight_recorder_windows_hold_the_socket_calls() {
    let Some((tracefs, _lock)) = kernel() else {
        return;
    };
    let (_sweep, mut flight) = switches_flight_recorder(&tracefs);
    let start = clock_sample()[1];
    let (mut a, b) = UnixStream::pair().unwrap();
    let receiver = std::thread::spawn(move || {
        for _ in 0..30 {
            assert!(recv_all(b.as_raw_fd(), 77, Way::Plain));
        }
        gettid()
    });
    let sender = gettid();
    for _ in 0..30 {
        a.write_all(&[1; 77]).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let receiver = receiver.join().unwrap();
    let end = clock_sample()[1];
    let (dir, manifest) = flight_window(&mut flight, start, end);
    let section = manifest
        .socket_calls
        .unwrap_or_else(|| panic!("no socket calls recorded: {:?}", manifest.warnings));
    let records = read_socket_calls(&dir.path().join(&section.file)).expect("read");
    assert_eq!(records.len() as u64, section.records);
    assert!(
        records.iter().all(|r| r.mono_ns <= end),
        "none after the window"
    );
    let sends = records
        .iter()
        .filter(|r| r.tid == sender && r.sent && r.bytes == 77)
        .filter(|r| (start..=end).contains(&r.mono_ns))
        .count();
    let received: u64 = records
        .iter()
        .filter(|r| r.tid == receiver && !r.sent)
        .map(|r| r.bytes)
        .sum();
    assert_eq!(sends, 30, "{records:?}");
    assert_eq!(received, 30 * 77, "{records:?}");
    flight.stop().expect("stop");
}
