//! Thin, checked wrappers over the few system calls the recorder needs that
//! std does not offer. Every `unsafe` of the crate lives here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Nanoseconds of the given clock.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec. clock_gettime cannot fail for
    // CLOCK_REALTIME/CLOCK_MONOTONIC with a valid pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn mono_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// A (CLOCK_REALTIME, CLOCK_MONOTONIC) pair read as close together as we
/// can: the realtime read is bracketed by two monotonic reads, the tightest of
/// three brackets wins, and its midpoint is the monotonic value.
pub fn clock_pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0u64, 0u64); // (bracket width, realtime, mono)
    for _ in 0..3 {
        let m1 = mono_ns();
        let r = realtime_ns();
        let m2 = mono_ns();
        let width = m2.saturating_sub(m1);
        if width < best.0 {
            best = (width, r, m1 + width / 2);
        }
    }
    (best.1, best.2)
}

/// splice(2) without offsets (both ends are pipes or stream-like files).
pub fn splice(from: RawFd, to: RawFd, len: usize, flags: libc::c_uint) -> io::Result<usize> {
    // SAFETY: null offsets are allowed; the fds are owned by the caller.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A pipe, both ends close-on-exec so that the traced command never inherits them.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for two descriptors.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Grows a pipe towards `size` bytes; returns the capacity it ended with.
pub fn set_pipe_size(fd: &impl AsRawFd, size: usize) -> usize {
    // SAFETY: plain fcntl on a descriptor we own. Failure (the limit in
    // /proc/sys/fs/pipe-max-size) only means a smaller pipe.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int);
        let got = libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ);
        if got > 0 {
            got as usize
        } else {
            4096 * 16
        }
    }
}

/// Waits up to `timeout_ms` for `fd` to be readable.
pub fn poll_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    match check(unsafe { libc::poll(&mut pfd, 1, timeout_ms) }) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// True if a process with this pid exists (even if owned by someone else).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let ret = unsafe { libc::kill(pid, 0) };
    ret == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

pub fn send_signal(pid: i32, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    check(unsafe { libc::kill(pid, sig) }).map(|_| ())
}

pub fn mount_tracefs(target: &Path) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    check(unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    })
    .map(|_| ())
}

/// The five uname(2) fields: sysname, nodename, release, version, machine.
pub fn uname() -> [String; 5] {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; uname cannot fail with one.
    unsafe { libc::uname(&mut u) };
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    [
        field(&u.sysname),
        field(&u.nodename),
        field(&u.release),
        field(&u.version),
        field(&u.machine),
    ]
}

pub fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}
