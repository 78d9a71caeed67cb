//! ns per line of the recorder's two busiest capture files (a sleep in a
//! system call, a socket call), written as the capture's thread writes
//! them (`write_line` into a reused String), against the same fields
//! through `core::fmt` (`write!`), which the recorder used before, in the
//! same run.

use std::fmt::Write as _;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use deepspan_model::Socket;
use deepspan_record::{BlockedSyscall, SocketCall};

fn blocked() -> BlockedSyscall {
    BlockedSyscall {
        mono_ns: 457_084_414_274_118,
        cpu: 1,
        tid: 81_930,
        tgid: 81_901,
        nr: 202,
        args: [0x7f3a_5c00_1a48, 0x80, 0],
        read_chars: Some(1_845_211),
    }
}

fn socket() -> SocketCall {
    SocketCall {
        mono_ns: 457_084_502_113_007,
        cpu: 1,
        tid: 81_930,
        tgid: 81_901,
        sent: true,
        bytes: 2048,
        socket: Some(Socket {
            cookie: 40_967,
            local_port: 8080,
            remote_port: 41_236,
        }),
    }
}

fn lines(c: &mut Criterion) {
    let mut group = c.benchmark_group("capture_lines");
    let mut line = String::with_capacity(128);
    let b = blocked();
    group.bench_function("blocked_syscall/write_line", |bench| {
        bench.iter(|| {
            line.clear();
            black_box(&b).write_line(&mut line);
            black_box(line.len())
        })
    });
    group.bench_function("blocked_syscall/core_fmt", |bench| {
        bench.iter(|| {
            line.clear();
            let b = black_box(&b);
            let [a0, a1, a2] = b.args;
            let _ = write!(
                line,
                "{} {} {} {} {} {a0:#x} {a1:#x} {a2:#x} {}",
                b.mono_ns,
                b.cpu,
                b.tid,
                b.tgid,
                b.nr,
                b.read_chars.unwrap_or(0)
            );
            black_box(line.len())
        })
    });
    let s = socket();
    group.bench_function("socket_call/write_line", |bench| {
        bench.iter(|| {
            line.clear();
            black_box(&s).write_line(&mut line);
            black_box(line.len())
        })
    });
    group.bench_function("socket_call/core_fmt", |bench| {
        bench.iter(|| {
            line.clear();
            let s = black_box(&s);
            let sock = s.socket.unwrap();
            let _ = write!(
                line,
                "{} {} {} {} {} {} {} {} {}",
                s.mono_ns,
                s.cpu,
                s.tid,
                s.tgid,
                if s.sent { "send" } else { "recv" },
                s.bytes,
                sock.cookie,
                sock.local_port,
                sock.remote_port
            );
            black_box(line.len())
        })
    });
    group.finish();
}

criterion_group!(benches, lines);
criterion_main!(benches);
