//! Moving ring-buffer pages from `per_cpu/cpuN/trace_pipe_raw` to files,
//! untouched (no text, no decoding).
//!
//! Two ways, both consuming the pages they take:
//! - [`Streams`]: one thread per CPU splices whole pages into
//!   `cpuN.raw` while tracing runs (standard mode). splice only hands out
//!   *full* pages, so when tracing stops each thread finishes with read()s,
//!   which also return the partly filled page the writer was on.
//! - [`drain_cpu`]: read() pages until the buffer is empty (flight-mode
//!   snapshots and the final flush).

use deepspan_run::Run;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::{sys, Error};

/// How long a stream thread sleeps in poll() before looking at the stop flag
/// again: bounds the stop latency without waking up often.
const POLL_MS: i32 = 100;

/// Opens `trace_pipe_raw` of one CPU without blocking. `None` when the CPU
/// has no buffer (offline, or not in the possible mask).
fn open_raw(path: &Path) -> Result<Option<File>, Error> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV) | Some(libc::ENOENT)) => Ok(None),
        Err(e) => Err(Error::tracefs("open", path, e)),
    }
}

fn create_out(path: &Path, kept: &Path) -> Result<File, Error> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::output("create", path, kept, e))
}

/// Where a drain stops early (flight snapshots taken while tracing goes on).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DrainLimit {
    /// Stop after the first page whose first event is later than this
    /// (trace-clock ns): the snapshot covers up to the request.
    pub until_ts: u64,
    /// Never take more than this many bytes, even if writers keep up.
    pub max_bytes: u64,
}

/// Reads every page left in `raw` (a CPU's `trace_pipe_raw`) into `out`,
/// using read(), which also returns a partly filled last page. Returns the
/// bytes written (whole pages).
pub(crate) fn drain_cpu(
    raw: &Path,
    out: &Path,
    kept: &Path,
    page_size: usize,
    limit: Option<DrainLimit>,
) -> Result<u64, Error> {
    let mut file = create_out(out, kept)?;
    let Some(mut src) = open_raw(raw)? else {
        return Ok(0);
    };
    drain_open(&mut src, raw, &mut file, out, kept, page_size, limit)
}

fn drain_open(
    src: &mut File,
    raw: &Path,
    file: &mut File,
    out: &Path,
    kept: &Path,
    page_size: usize,
    limit: Option<DrainLimit>,
) -> Result<u64, Error> {
    let mut page = vec![0u8; page_size];
    let mut written = 0u64;
    loop {
        let mut fill = 0;
        // The kernel hands out one page per read(); loop only in case a
        // read ever returns less, so pages stay aligned in the file.
        while fill < page_size {
            match src.read(&mut page[fill..]) {
                Ok(0) => break,
                Ok(n) => fill += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(Error::tracefs("read", raw, e)),
            }
        }
        if fill == 0 {
            return Ok(written);
        }
        page[fill..].fill(0);
        // The commit word (after the u64 timestamp) is 0 only for a page
        // with neither events nor a lost-events mark: nothing to keep.
        let commit = u64::from_ne_bytes(page[8..16].try_into().expect("page has a header"));
        if commit == 0 {
            continue;
        }
        file.write_all(&page)
            .map_err(|e| Error::output("write", out, kept, e))?;
        written += page_size as u64;
        if let Some(limit) = limit {
            let page_ts = u64::from_ne_bytes(page[..8].try_into().expect("page has a header"));
            if page_ts > limit.until_ts || written >= limit.max_bytes {
                return Ok(written);
            }
        }
    }
}

/// Per-CPU splice threads of a standard recording.
pub(crate) struct Streams {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    bytes: Arc<Vec<AtomicU64>>,
    threads: Vec<(usize, JoinHandle<Result<(), Error>>)>,
    pub files: Vec<PathBuf>,
}

impl Streams {
    /// Starts one thread per CPU of the instance at `instance_dir`, writing
    /// the run's raw pages ([`Run::raw_pages`]).
    pub fn start(
        instance_dir: &Path,
        cpus: usize,
        run: &Run,
        page_size: usize,
    ) -> Result<Streams, Error> {
        let out_dir = run.kernel_dir();
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicBool::new(false));
        let bytes: Arc<Vec<AtomicU64>> = Arc::new((0..cpus).map(|_| AtomicU64::new(0)).collect());
        let mut streams = Streams {
            stop,
            failed,
            bytes,
            threads: Vec::new(),
            files: Vec::new(),
        };
        for cpu in 0..cpus {
            let out = run.raw_pages(cpu);
            let raw_path = instance_dir.join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
            let file = create_out(&out, &out_dir)?;
            streams.files.push(out.clone());
            let Some(raw) = open_raw(&raw_path)? else {
                continue;
            };
            let ctx = StreamCtx {
                cpu,
                raw,
                raw_path,
                file,
                out,
                kept: out_dir.to_path_buf(),
                page_size,
                stop: streams.stop.clone(),
                failed: streams.failed.clone(),
                bytes: streams.bytes.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("deepspan-cpu{cpu}"))
                .spawn(move || ctx.run())
                .map_err(|e| Error::io("start a capture thread for", &out_dir, e))?;
            streams.threads.push((cpu, handle));
        }
        Ok(streams)
    }

    /// Bytes written so far, per CPU.
    pub fn bytes(&self) -> Vec<u64> {
        self.bytes
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    /// True once a thread has failed (disk full…): the recording should stop.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Asks the threads to flush what is left and exit, and waits for them.
    /// Call after tracing was switched off, so the flush reaches the end.
    pub fn finish(mut self) -> Result<Vec<u64>, Error> {
        self.stop.store(true, Ordering::SeqCst);
        let mut first_error = None;
        for (cpu, handle) in self.threads.drain(..) {
            let result = handle.join().unwrap_or_else(|_| {
                Err(Error::Io {
                    action: "capture",
                    path: PathBuf::from(format!("cpu{cpu}")),
                    source: io::Error::other("capture thread panicked"),
                })
            });
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(self.bytes()),
        }
    }
}

impl Drop for Streams {
    /// On early exit, make sure no thread keeps a tracefs file open (the
    /// instance could not be removed) or keeps running.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for (_, handle) in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

struct StreamCtx {
    cpu: usize,
    raw: File,
    raw_path: PathBuf,
    file: File,
    out: PathBuf,
    kept: PathBuf,
    page_size: usize,
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
    bytes: Arc<Vec<AtomicU64>>,
}

impl StreamCtx {
    fn run(mut self) -> Result<(), Error> {
        let result = self.stream();
        if result.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        result
    }

    fn stream(&mut self) -> Result<(), Error> {
        let (pipe_r, pipe_w) =
            sys::pipe().map_err(|e| Error::io("create a pipe for", &self.out, e))?;
        // A bigger pipe moves more pages per wake-up; the page count must stay whole.
        let capacity = sys::set_pipe_size(&pipe_w, 1 << 20) / self.page_size * self.page_size;
        let capacity = capacity.max(self.page_size);
        loop {
            // Read the flag before moving pages: once it is set, tracing is
            // off and one more pass empties the buffer.
            let stopping = self.stop.load(Ordering::SeqCst);
            self.splice_available(&pipe_r, &pipe_w, capacity)?;
            if stopping {
                let n = drain_open(
                    &mut self.raw,
                    &self.raw_path,
                    &mut self.file,
                    &self.out,
                    &self.kept,
                    self.page_size,
                    None,
                )?;
                self.bytes[self.cpu].fetch_add(n, Ordering::Relaxed);
                return Ok(());
            }
            // Wakes when the buffer passes the instance's buffer_percent, or
            // on timeout to look at the stop flag.
            sys::poll_readable(self.raw.as_raw_fd(), POLL_MS)
                .map_err(|e| Error::tracefs("poll", &self.raw_path, e))?;
        }
    }

    /// Splices every full page available now into the output file.
    fn splice_available(
        &mut self,
        pipe_r: &impl AsRawFd,
        pipe_w: &impl AsRawFd,
        capacity: usize,
    ) -> Result<(), Error> {
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        loop {
            let n = match sys::splice(self.raw.as_raw_fd(), pipe_w.as_raw_fd(), capacity, flags) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::tracefs("splice from", &self.raw_path, e)),
            };
            let mut left = n;
            while left > 0 {
                match sys::splice(
                    pipe_r.as_raw_fd(),
                    self.file.as_raw_fd(),
                    left,
                    libc::SPLICE_F_MOVE,
                ) {
                    Ok(0) => {
                        return Err(Error::io(
                            "write",
                            &self.out,
                            io::Error::other("pipe emptied unexpectedly"),
                        ));
                    }
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::output("write", &self.out, &self.kept, e)),
                }
            }
            self.bytes[self.cpu].fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}
