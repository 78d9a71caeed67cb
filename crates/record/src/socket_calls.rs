//! Each time a user thread's socket receive returned data, and each time
//! its socket send sent data, with the bytes, for every recording and
//! every flight recorder window.
//!
//! Why: a thread of a program without a tracing SDK is placed in a span by
//! its socket I/O: a server's receive of a request ends where its work
//! starts, and its send of the response is where the work ends. That
//! evidence has come from the `raw_syscalls:sys_enter` and `sys_exit`
//! events, which put every thread of the host on the system-call slow path
//! and are most of a trace's events; a recording without them (the `lean`
//! preset) keeps it from this file. An eBPF program
//! (`bpf/socket_calls.bpf.c`) hooks the BTF-typed `sock_recv_length` and
//! `sock_send_length` tracepoints, which fire as a socket's protocol
//! returns from a receive (recvfrom, recvmsg, read on a socket) or a send
//! (sendto, sendmsg, write on a socket), for every socket family, kernel
//! threads left out. Its header says more, and why not fexit on
//! `sock_recvmsg` and fentry on `security_socket_sendmsg` (which would
//! give a send's start and the bytes asked): programs that attach through
//! a BPF trampoline do not load on the kernel this was written on.
//!
//! Written to `RUN/kernel/socket_calls.tsv`: a header line, then one call
//! a line, fields separated by one space (see [`SocketCall`]):
//!
//! ```text
//! # deepspan socket calls v2: mono_ns cpu tid tgid dir bytes socket local_port remote_port
//! 457084414274 1 8193 8190 recv 512 4097 8080 41236
//! 457084502113 1 8193 8190 send 2048 4097 8080 41236
//! ```
//!
//! `mono_ns` is CLOCK_MONOTONIC (the trace's clock) at the end of the
//! call's socket work, inside its system call: for a `recv` when the data
//! was copied out (`bytes` is what the call returns, more than 0), for a
//! `send` when the data was queued (`bytes` is what was sent: for a
//! blocking send, all it was asked to send). A call that moved no data
//! (0, an error, EAGAIN) has no line. Lines are in the order the program
//! wrote them: time order, but for calls on two CPUs a moment apart.
//!
//! `socket` is the socket's cookie (see [`Socket`]): an acceptor's receive
//! of a request and a pool thread's send of its answer have the same one.
//! The ports are TCP's or UDP's (0 for other families): a server span's
//! `client.port` is its connection's `remote_port`. Files of v1, before
//! the socket was recorded, still read, with no socket (`-`).
//!
//! The flight recorder keeps them in memory and writes each window's with
//! it. A kernel without BPF, BTF or these tracepoints, or a build without
//! clang, records no file and the manifest's warnings say why.

use std::path::Path;

use crate::bpf::Ring;
use crate::capture_file::{self, CaptureLine, Fields, Recorded, Written};
use crate::sched_switch::SwitchProgram;
use crate::Error;
use deepspan_model::Socket;
use deepspan_run::{layout::SOCKET_CALLS, SocketCallsManifest};

/// The file's first line; the columns of every other line.
const HEADER: &str =
    "# deepspan socket calls v2: mono_ns cpu tid tgid dir bytes socket local_port remote_port";

/// A record of the program's ring buffer (`struct call`).
const RECORD_BYTES: usize = 48;

/// A socket receive or send that moved data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketCall {
    /// CLOCK_MONOTONIC ns, where the call's socket work ended (inside its
    /// system call).
    pub mono_ns: u64,
    pub cpu: u32,
    pub tid: i32,
    /// The thread's process.
    pub tgid: i32,
    /// A send (`send`), or a receive (`recv`).
    pub sent: bool,
    /// What the receive returned, or what the send sent (more than 0).
    pub bytes: u64,
    /// The socket; `None` in a file of v1.
    pub socket: Option<Socket>,
}

impl SocketCall {
    /// Parses one line of the socket-call file.
    pub fn parse(line: &str) -> Result<SocketCall, String> {
        SocketCall::parse_version(2, line)
    }

    /// Parses one line of a file of `version` (1: without the socket).
    fn parse_version(version: u32, line: &str) -> Result<SocketCall, String> {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let (&[mono_ns, cpu, tid, tgid, dir, bytes], socket) = (match (version, &fields[..]) {
            (1, f @ [_, _, _, _, _, _]) => Some((f, None)),
            (_, [f @ .., socket, local, remote]) if version > 1 && f.len() == 6 => {
                Some((f, Some([*socket, *local, *remote])))
            }
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "{} fields, expected {} ({HEADER})",
                fields.len(),
                if version == 1 { 6 } else { 9 }
            )
        })?
        else {
            unreachable!("six fields matched")
        };
        fn num<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not a number in range"))
        }
        let sent = match dir {
            "send" => true,
            "recv" => false,
            other => return Err(format!("direction {other:?}, expected recv or send")),
        };
        let socket = match socket {
            None | Some(["-", "-", "-"]) => None,
            Some([cookie, local, remote]) => Some(Socket {
                cookie: num("socket", cookie)?,
                local_port: num("local port", local)?,
                remote_port: num("remote port", remote)?,
            }),
        };
        Ok(SocketCall {
            mono_ns: num("time", mono_ns)?,
            cpu: num("cpu", cpu)?,
            tid: num("tid", tid)?,
            tgid: num("tgid", tgid)?,
            sent,
            bytes: num("bytes", bytes)?,
            socket,
        })
    }

    /// Appends the line (without its newline) to `out`, with no
    /// allocation: the capture's thread writes thousands a second.
    pub fn write_line(&self, out: &mut String) {
        let mut fields = Fields::new(out);
        fields
            .num(self.mono_ns)
            .num(self.cpu)
            .num(self.tid)
            .num(self.tgid)
            .text(if self.sent { "send" } else { "recv" })
            .num(self.bytes);
        match self.socket {
            Some(s) => fields.num(s.cookie).num(s.local_port).num(s.remote_port),
            None => fields.text("-").text("-").text("-"),
        };
    }

    /// A record of the program's ring buffer, or None when it is not one.
    fn from_record(b: &[u8]) -> Option<SocketCall> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u16_at = |at: usize| u16::from_ne_bytes(b[at..at + 2].try_into().expect("2 bytes"));
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let cookie = u64_at(32);
        Some(SocketCall {
            mono_ns: u64_at(0),
            cpu: u32_at(8),
            tid: u32_at(12) as i32,
            tgid: u32_at(16) as i32,
            sent: u32_at(20) != 0,
            bytes: u64_at(24),
            // A cookie is never 0: 0 is a kernel that gave none.
            socket: (cookie != 0).then(|| Socket {
                cookie,
                local_port: u16_at(40),
                remote_port: u16_at(42),
            }),
        })
    }
}

impl CaptureLine for SocketCall {
    const HEADER: &'static str = HEADER;

    fn write_line(&self, out: &mut String) {
        Self::write_line(self, out)
    }
    const WHAT: &'static str = "socket calls";

    fn from_record(record: &[u8]) -> Option<SocketCall> {
        SocketCall::from_record(record)
    }

    fn from_line(line: &str) -> Result<SocketCall, String> {
        SocketCall::parse(line)
    }

    const OLDER_VERSIONS: &'static [u32] = &[1];

    fn from_line_of(version: u32, line: &str) -> Result<SocketCall, String> {
        SocketCall::parse_version(version, line)
    }

    fn mono_ns(&self) -> u64 {
        self.mono_ns
    }
}

/// Parses the text of a socket-call file: every call, in file order. A
/// last line without its newline is what a killed recorder left
/// mid-write: it is left out. A header of another version than v1 or v2
/// is an error, as is any bad line; the error names the line and says why.
pub fn parse_socket_calls(text: &str) -> Result<Vec<SocketCall>, String> {
    capture_file::parse_file(text)
}

/// Reads a run's socket-call file (see [`parse_socket_calls`]).
pub fn read_socket_calls(path: &Path) -> Result<Vec<SocketCall>, Error> {
    capture_file::read_file(path)
}

impl Recorded for SocketCall {
    const FILE: &'static str = SOCKET_CALLS;
    const THREAD: &'static str = "deepspan-sockets";
    /// 48 bytes each, 48 MB: a host making 20 000 socket calls a second
    /// fills it in 50 s, longer than the trace's own history on such a
    /// host.
    const HISTORY: usize = 1_000_000;
    type Section = SocketCallsManifest;

    fn attach(_switch: &mut SwitchProgram) -> Result<Ring, String> {
        program::attach()
    }

    fn section(written: Written) -> SocketCallsManifest {
        SocketCallsManifest {
            file: SOCKET_CALLS.into(),
            records: written.records,
            lost: written.lost,
        }
    }
}

#[cfg(deepspan_bpf)]
mod program {
    use crate::bpf::Ring;

    /// The ELF reader needs the object aligned, which include_bytes! is not.
    static OBJECT: &[u8] =
        aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/socket_calls.bpf.o"));

    pub(super) fn attach() -> Result<Ring, String> {
        crate::bpf::load_tracepoints(
            OBJECT,
            "the socket-call program",
            "CALLS",
            &["sock_recv_length", "sock_send_length"],
            "it needs the sock_recv_length and sock_send_length tracepoints",
        )
    }
}

#[cfg(not(deepspan_bpf))]
mod program {
    pub(super) fn attach() -> Result<crate::bpf::Ring, String> {
        Err(crate::bpf::not_built("socket calls"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::RecordSink;
    use crate::capture_file::FileSink;

    fn recv() -> SocketCall {
        SocketCall {
            mono_ns: 457084414274,
            cpu: 1,
            tid: 8193,
            tgid: 8190,
            sent: false,
            bytes: 512,
            socket: Some(Socket {
                cookie: 4097,
                local_port: 8080,
                remote_port: 41236,
            }),
        }
    }

    fn send() -> SocketCall {
        SocketCall {
            mono_ns: 457084502113,
            sent: true,
            bytes: 2048,
            ..recv()
        }
    }

    #[test]
    fn a_line_reads_back() {
        for (line, call) in [
            ("457084414274 1 8193 8190 recv 512 4097 8080 41236", recv()),
            ("457084502113 1 8193 8190 send 2048 4097 8080 41236", send()),
            (
                "457084502113 1 8193 8190 send 2048 - - -",
                SocketCall {
                    socket: None,
                    ..send()
                },
            ),
        ] {
            let c = SocketCall::parse(line).unwrap();
            assert_eq!(c, call);
            assert_eq!(c.line(), line);
        }
        let max = SocketCall {
            mono_ns: u64::MAX,
            cpu: u32::MAX,
            tid: i32::MAX,
            tgid: i32::MIN,
            bytes: u64::MAX,
            socket: Some(Socket {
                cookie: u64::MAX,
                local_port: u16::MAX,
                remote_port: u16::MAX,
            }),
            ..send()
        };
        assert_eq!(SocketCall::parse(&max.line()).unwrap(), max);
    }

    #[test]
    fn bad_lines_say_why() {
        for (line, expected) in [
            ("x 1 2 3 recv 5 7 80 9", "time"),
            ("1 x 2 3 recv 5 7 80 9", "cpu"),
            ("1 0 2147483648 3 recv 5 7 80 9", "tid"),
            ("1 0 2 3.0 recv 5 7 80 9", "tgid"),
            ("1 0 2 3 recv -5 7 80 9", "bytes"),
            ("1 0 2 3 recv 18446744073709551616 7 80 9", "bytes"),
            (
                "1 0 2 3 RECV 5 7 80 9",
                "direction \"RECV\", expected recv or send",
            ),
            ("1 0 2 3 recv 5 -7 80 9", "socket \"-7\""),
            ("1 0 2 3 recv 5 7 65536 9", "local port"),
            ("1 0 2 3 recv 5 7 80 -", "remote port"),
            ("1 0 2 3 recv 5 7 80", "8 fields, expected 9"),
            ("1 0 2 3 send 5", "6 fields, expected 9"),
        ] {
            let e = SocketCall::parse(line).unwrap_err();
            assert!(e.contains(expected), "{line}: {e}");
        }
    }

    #[test]
    fn a_file_reads_back_and_its_errors_name_the_line() {
        let text = format!("{HEADER}\n{}\n{}\n", recv().line(), send().line());
        assert_eq!(parse_socket_calls(&text).unwrap(), vec![recv(), send()]);
        // A recorder killed mid-line: the torn line is left out.
        assert_eq!(
            parse_socket_calls(&format!("{text}457084502114 1 81")).unwrap(),
            vec![recv(), send()]
        );
        for (bad, expected) in [
            ("1 0 2 3 recv 5\n", "line 4: 6 fields"),
            ("1 0 2 3 sent 5 7 80 9\n", "line 4: direction \"sent\""),
            ("1 0 2 3 send 0x5 7 80 9\n", "line 4: bytes \"0x5\""),
        ] {
            let e = parse_socket_calls(&format!("{text}{bad}")).unwrap_err();
            assert!(e.starts_with(expected), "{bad}: {e}");
        }
        // A file of v1, before the socket was recorded, reads with none.
        let v1 = "# deepspan socket calls v1: mono_ns cpu tid tgid dir bytes\n\
                  457084414274 1 8193 8190 recv 512\n";
        assert_eq!(
            parse_socket_calls(v1).unwrap(),
            vec![SocketCall {
                socket: None,
                ..recv()
            }]
        );
        let e = parse_socket_calls(&format!("{v1}1 0 2 3 recv 5 7 80 9\n")).unwrap_err();
        assert!(e.starts_with("line 3: 9 fields, expected 6"), "{e}");
        // Another version's file is refused, not misread.
        let e = parse_socket_calls("# deepspan socket calls v3: mono_ns tid dir\n1 2 recv\n")
            .unwrap_err();
        assert!(e.starts_with("line 1: ") && e.contains("v3"), "{e}");
        // A line before the header, a wrong header: the line is still read
        // for what it is, and bad text is never a panic.
        for junk in ["\u{0}", "recv", " \t ", "1 2 3 4 send 5 ", "é 1 2 3 recv 4"] {
            let _ = parse_socket_calls(&format!("{junk}\n"));
        }
        assert_eq!(parse_socket_calls("").unwrap(), vec![]);
    }

    #[test]
    fn a_ring_record_reads_as_the_program_wrote_it() {
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&457084502113u64.to_ne_bytes());
        record[8..12].copy_from_slice(&1u32.to_ne_bytes());
        record[12..16].copy_from_slice(&8193i32.to_ne_bytes());
        record[16..20].copy_from_slice(&8190i32.to_ne_bytes());
        record[20..24].copy_from_slice(&1u32.to_ne_bytes());
        record[24..32].copy_from_slice(&2048u64.to_ne_bytes());
        record[32..40].copy_from_slice(&4097u64.to_ne_bytes());
        record[40..42].copy_from_slice(&8080u16.to_ne_bytes());
        record[42..44].copy_from_slice(&41236u16.to_ne_bytes());
        assert_eq!(SocketCall::from_record(&record), Some(send()));
        assert_eq!(SocketCall::from_record(&record[..32]), None);
        // No cookie: a kernel that named no socket.
        record[32..40].fill(0);
        assert_eq!(
            SocketCall::from_record(&record).and_then(|c| c.socket),
            None
        );
    }

    #[test]
    fn the_sink_writes_what_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket_calls.tsv");
        let mut sink = FileSink::<SocketCall>::create(&path).unwrap();
        sink.push_line(&recv()).unwrap();
        sink.push_line(&send()).unwrap();
        // Shorter than a record: not one, skipped.
        sink.push(&[0u8; 12]).unwrap();
        let m = SocketCall::section(sink.finish(3).unwrap());
        assert_eq!(
            m,
            SocketCallsManifest {
                file: "kernel/socket_calls.tsv".into(),
                records: 2,
                lost: 3
            }
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "# deepspan socket calls v2: mono_ns cpu tid tgid dir bytes socket local_port remote_port\n\
             457084414274 1 8193 8190 recv 512 4097 8080 41236\n\
             457084502113 1 8193 8190 send 2048 4097 8080 41236\n"
        );
        assert_eq!(read_socket_calls(&path).unwrap(), vec![recv(), send()]);
        // A bad complete line is an error that says which file, which line
        // and why.
        std::fs::write(&path, format!("{text}5 0 42 42 recv x 7 80 9\n")).unwrap();
        let e = read_socket_calls(&path).unwrap_err().to_string();
        assert!(
            e.contains("line 4") && e.contains("bytes") && e.contains("socket_calls.tsv"),
            "{e}"
        );
    }
}
