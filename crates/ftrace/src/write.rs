//! trace.dat version 6 writer (the format of trace-cmd(1), see
//! trace-cmd.dat.v6(5)), so that recordings open in trace-cmd and KernelShark
//! as well as in deepspan.
//!
//! The per-CPU ring-buffer pages are copied verbatim from files the recorder
//! filled from `per_cpu/cpuN/trace_pipe_raw`; nothing is decoded here. The
//! copy goes through `std::io::copy`, which uses `copy_file_range` between
//! files on Linux, so multi-GB traces cost no user-space buffering.
//!
//! Numbers are written in the host's byte order, which the file declares:
//! the pages come from the running kernel, so they are in host order too.

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Option ids of trace.dat (trace-cmd's `TRACECMD_OPTION_*`).
const OPTION_DONE: u16 = 0;
const OPTION_CPUSTAT: u16 = 2;
const OPTION_TRACECLOCK: u16 = 4;
const OPTION_UNAME: u16 = 5;

/// Everything a trace.dat holds besides the ring-buffer pages.
///
/// The byte fields are the kernel's files copied as they are; see each field
/// for where it comes from.
#[derive(Clone, Debug, Default)]
pub struct TraceDatMeta {
    /// Size of one ring-buffer page (sub-buffer) in bytes: every CPU data file
    /// is a sequence of pages of this size. A power of two.
    pub page_size: u32,
    /// Size of a C `long` of the traced kernel (8 on 64-bit).
    pub long_size: u8,
    /// `events/header_page`.
    pub header_page: Vec<u8>,
    /// `events/header_event`.
    pub header_event: Vec<u8>,
    /// `events/ftrace/*/format`: the formats of the ftrace-internal events
    /// (`print` for trace_marker writes, …).
    pub ftrace_formats: Vec<Vec<u8>>,
    /// Per system (`sched`, `irq`, …), the `events/<system>/<event>/format`
    /// files of the events that may appear in the data.
    pub event_formats: Vec<(String, Vec<Vec<u8>>)>,
    /// `/proc/kallsyms`, used to print kernel addresses (hrtimer functions…)
    /// as symbols. May be empty.
    pub kallsyms: Vec<u8>,
    /// `printk_formats`. May be empty.
    pub printk_formats: Vec<u8>,
    /// `pid comm` lines (`saved_cmdlines`), naming the tasks of the trace.
    pub cmdlines: Vec<u8>,
    /// Name of the trace clock the pages were stamped with, e.g. `mono`.
    pub trace_clock: String,
    /// `uname -a`-like text describing the traced host, if known.
    pub uname: Option<String>,
    /// `per_cpu/cpuN/stats` text per CPU (index = CPU), kept in the file so
    /// that `trace-cmd report --stat` shows overruns. May be empty.
    pub cpu_stats: Vec<String>,
}

/// A trace.dat could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write trace file {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: String,
        source: io::Error,
    },
    #[error("cannot write trace file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl WriteError {
    /// The underlying I/O error, if any (e.g. to recognise ENOSPC).
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            WriteError::Io { source, .. } => Some(source),
            WriteError::Invalid { .. } => None,
        }
    }
}

/// Writes `out` as a trace.dat v6 file made of `meta` and, for CPU `i`, the
/// raw ring-buffer pages in `cpu_data[i]` (a file whose size is a multiple of
/// `meta.page_size`; an empty file is a CPU without events).
///
/// The file is first written as `<out>.partial` and renamed when complete, so
/// nobody ever reads a half-written trace. Returns the size of the file.
pub fn write_trace_dat(
    out: &Path,
    meta: &TraceDatMeta,
    cpu_data: &[PathBuf],
) -> Result<u64, WriteError> {
    validate(out, meta)?;
    let partial = partial_path(out);
    let result = write_to(&partial, out, meta, cpu_data);
    match result {
        Ok(size) => {
            fs::rename(&partial, out).map_err(|source| WriteError::Io {
                path: out.to_path_buf(),
                what: format!("renaming {} into place", partial.display()),
                source,
            })?;
            Ok(size)
        }
        Err(e) => {
            // A truncated trace would only mislead readers later.
            let _ = fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

fn validate(out: &Path, meta: &TraceDatMeta) -> Result<(), WriteError> {
    let invalid = |reason: String| {
        Err(WriteError::Invalid {
            path: out.to_path_buf(),
            reason,
        })
    };
    if !meta.page_size.is_power_of_two() || meta.page_size < 64 {
        return invalid(format!(
            "page size {} is not a power of two of at least 64 bytes",
            meta.page_size
        ));
    }
    if meta.long_size != 4 && meta.long_size != 8 {
        return invalid(format!("long size {} is neither 4 nor 8", meta.long_size));
    }
    // These sections have 32-bit sizes in v6.
    for (name, len) in [
        ("kallsyms", meta.kallsyms.len()),
        ("printk formats", meta.printk_formats.len()),
    ] {
        if u32::try_from(len).is_err() {
            return invalid(format!(
                "{name} are {len} bytes, more than a v6 file can hold"
            ));
        }
    }
    if meta.trace_clock.is_empty() || meta.trace_clock.contains(['[', ']', ' ', '\0']) {
        return invalid(format!(
            "trace clock name {:?} is not a plain clock name",
            meta.trace_clock
        ));
    }
    for (system, _) in &meta.event_formats {
        if system.is_empty() || system.contains('\0') {
            return invalid(format!(
                "event system name {system:?} is empty or contains NUL"
            ));
        }
    }
    Ok(())
}

/// Tracks the output path and the current section for error messages.
struct Out {
    w: BufWriter<File>,
    path: PathBuf,
}

impl Out {
    fn put(&mut self, bytes: &[u8], what: &str) -> Result<(), WriteError> {
        self.w
            .write_all(bytes)
            .map_err(|source| self.err(what, source))
    }

    fn err(&self, what: &str, source: io::Error) -> WriteError {
        WriteError::Io {
            path: self.path.clone(),
            what: what.to_string(),
            source,
        }
    }

    fn u16(&mut self, v: u16, what: &str) -> Result<(), WriteError> {
        self.put(&v.to_ne_bytes(), what)
    }
    fn u32(&mut self, v: u32, what: &str) -> Result<(), WriteError> {
        self.put(&v.to_ne_bytes(), what)
    }
    fn u64(&mut self, v: u64, what: &str) -> Result<(), WriteError> {
        self.put(&v.to_ne_bytes(), what)
    }

    /// A block preceded by its size as u64.
    fn block8(&mut self, data: &[u8], what: &str) -> Result<(), WriteError> {
        self.u64(data.len() as u64, what)?;
        self.put(data, what)
    }

    /// A block preceded by its size as u32 (validated beforehand).
    fn block4(&mut self, data: &[u8], what: &str) -> Result<(), WriteError> {
        self.u32(data.len() as u32, what)?;
        self.put(data, what)
    }

    fn option(&mut self, id: u16, data: &[u8], what: &str) -> Result<(), WriteError> {
        let len = u32::try_from(data.len()).map_err(|_| WriteError::Invalid {
            path: self.path.clone(),
            reason: format!("option {what} is too large ({} bytes)", data.len()),
        })?;
        self.u16(id, what)?;
        self.u32(len, what)?;
        self.put(data, what)
    }
}

fn count_u32(n: usize, what: &str, path: &Path) -> Result<u32, WriteError> {
    u32::try_from(n).map_err(|_| WriteError::Invalid {
        path: path.to_path_buf(),
        reason: format!("too many {what}: {n}"),
    })
}

fn write_to(
    partial: &Path,
    out: &Path,
    meta: &TraceDatMeta,
    cpu_data: &[PathBuf],
) -> Result<u64, WriteError> {
    let page = u64::from(meta.page_size);
    let mut sizes = Vec::with_capacity(cpu_data.len());
    for path in cpu_data {
        let size = fs::metadata(path)
            .map_err(|source| WriteError::Io {
                path: out.to_path_buf(),
                what: format!("reading the size of CPU data {}", path.display()),
                source,
            })?
            .len();
        if size % page != 0 {
            return Err(WriteError::Invalid {
                path: out.to_path_buf(),
                reason: format!(
                    "CPU data {} is {size} bytes, not a whole number of {page}-byte pages",
                    path.display()
                ),
            });
        }
        sizes.push(size);
    }

    let file = File::create(partial).map_err(|source| WriteError::Io {
        path: partial.to_path_buf(),
        what: "creating the file".into(),
        source,
    })?;
    let mut o = Out {
        w: BufWriter::with_capacity(1 << 20, file),
        path: partial.to_path_buf(),
    };

    // Initial format.
    o.put(b"\x17\x08\x44tracing6\0", "magic")?;
    o.put(
        &[u8::from(cfg!(target_endian = "big")), meta.long_size],
        "endianness and long size",
    )?;
    o.u32(meta.page_size, "page size")?;

    // Header info.
    o.put(b"header_page\0", "header_page")?;
    o.block8(&meta.header_page, "header_page")?;
    o.put(b"header_event\0", "header_event")?;
    o.block8(&meta.header_event, "header_event")?;

    o.u32(
        count_u32(meta.ftrace_formats.len(), "ftrace formats", out)?,
        "ftrace formats",
    )?;
    for format in &meta.ftrace_formats {
        o.block8(format, "ftrace formats")?;
    }

    o.u32(
        count_u32(meta.event_formats.len(), "event systems", out)?,
        "event formats",
    )?;
    for (system, formats) in &meta.event_formats {
        o.put(system.as_bytes(), "event formats")?;
        o.put(b"\0", "event formats")?;
        o.u32(
            count_u32(formats.len(), "event formats", out)?,
            "event formats",
        )?;
        for format in formats {
            o.block8(format, "event formats")?;
        }
    }

    o.block4(&meta.kallsyms, "kallsyms")?;
    o.block4(&meta.printk_formats, "printk formats")?;
    o.block8(&meta.cmdlines, "cmdlines")?;
    o.u32(count_u32(cpu_data.len(), "CPUs", out)?, "CPU count")?;

    // Options. The clock name is written the way the kernel's trace_clock
    // file marks the current clock, which is what readers look for.
    let clock = format!("[{}]", meta.trace_clock);
    o.put(b"options  \0", "options")?;
    let mut clock_option = clock.clone().into_bytes();
    clock_option.push(0);
    o.option(OPTION_TRACECLOCK, &clock_option, "trace clock option")?;
    if let Some(uname) = &meta.uname {
        let mut data = uname.clone().into_bytes();
        data.push(0);
        o.option(OPTION_UNAME, &data, "uname option")?;
    }
    for (cpu, stats) in meta.cpu_stats.iter().enumerate() {
        let mut data = format!("CPU: {cpu}\n{stats}").into_bytes();
        data.push(0);
        o.option(OPTION_CPUSTAT, &data, "CPU stats option")?;
    }
    o.u16(OPTION_DONE, "end of options")?;

    // Flyrecord: the CPU table, then (because of the TRACECLOCK option) the
    // clock again, then page-aligned CPU data.
    o.put(b"flyrecord\0", "flyrecord")?;
    let header_end = o.w.stream_position().map_err(|e| o.err("flyrecord", e))?
        + 16 * sizes.len() as u64
        + 8
        + clock.len() as u64;
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut next = header_end;
    for &size in &sizes {
        let offset = next.div_ceil(page) * page;
        offsets.push(offset);
        next = offset + size;
    }
    for (&offset, &size) in offsets.iter().zip(&sizes) {
        o.u64(offset, "CPU table")?;
        o.u64(size, "CPU table")?;
    }
    o.block8(clock.as_bytes(), "trace clock")?;

    let mut file = o.w.into_inner().map_err(|e| WriteError::Io {
        path: partial.to_path_buf(),
        what: "writing the headers".into(),
        source: e.into_error(),
    })?;
    for (cpu, (path, (&offset, &size))) in
        cpu_data.iter().zip(offsets.iter().zip(&sizes)).enumerate()
    {
        let what = || format!("copying CPU {cpu} data from {}", path.display());
        let io_err = |source| WriteError::Io {
            path: partial.to_path_buf(),
            what: what(),
            source,
        };
        file.seek(SeekFrom::Start(offset)).map_err(io_err)?;
        let mut src = File::open(path).map_err(io_err)?;
        let copied = io::copy(&mut src, &mut file).map_err(io_err)?;
        if copied != size {
            return Err(WriteError::Invalid {
                path: partial.to_path_buf(),
                reason: format!(
                    "{} changed size while being copied ({size} then {copied} bytes)",
                    path.display()
                ),
            });
        }
    }
    // A trailing CPU without data still needs the file to reach its offset,
    // or readers take the file as truncated.
    file.set_len(next).map_err(|source| WriteError::Io {
        path: partial.to_path_buf(),
        what: "setting the final size".into(),
        source,
    })?;
    file.sync_all().map_err(|source| WriteError::Io {
        path: partial.to_path_buf(),
        what: "syncing".into(),
        source,
    })?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> TraceDatMeta {
        TraceDatMeta {
            page_size: 4096,
            long_size: 8,
            header_page: b"hp".to_vec(),
            header_event: b"he".to_vec(),
            ftrace_formats: vec![b"f1".to_vec()],
            event_formats: vec![("sched".into(), vec![b"e1".to_vec(), b"e22".to_vec()])],
            kallsyms: b"ffffffff81000000 T _text\n".to_vec(),
            printk_formats: Vec::new(),
            cmdlines: b"1 init\n".to_vec(),
            trace_clock: "mono".into(),
            uname: Some("Linux test".into()),
            cpu_stats: vec!["entries: 0\n".into()],
        }
    }

    fn rd_u32(b: &[u8], at: &mut usize) -> u32 {
        let v = u32::from_ne_bytes(b[*at..*at + 4].try_into().unwrap());
        *at += 4;
        v
    }
    fn rd_u64(b: &[u8], at: &mut usize) -> u64 {
        let v = u64::from_ne_bytes(b[*at..*at + 8].try_into().unwrap());
        *at += 8;
        v
    }

    #[test]
    fn layout_follows_v6_and_cpu_data_is_page_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let cpu0 = dir.path().join("cpu0.raw");
        let cpu1 = dir.path().join("cpu1.raw");
        fs::write(&cpu0, vec![0xabu8; 8192]).unwrap();
        fs::write(&cpu1, b"").unwrap();
        let out = dir.path().join("trace.dat");
        let size = write_trace_dat(&out, &meta(), &[cpu0, cpu1]).unwrap();
        let b = fs::read(&out).unwrap();
        assert_eq!(b.len() as u64, size);
        assert!(!partial_path(&out).exists());
        assert_eq!(&b[..12], b"\x17\x08\x44tracing6\0");
        let mut at = 14;
        assert_eq!(rd_u32(&b, &mut at), 4096);
        assert_eq!(&b[at..at + 12], b"header_page\0");
        at += 12;
        assert_eq!(rd_u64(&b, &mut at), 2);
        at += 2;
        assert_eq!(&b[at..at + 13], b"header_event\0");
        at += 13 + 8 + 2;
        assert_eq!(rd_u32(&b, &mut at), 1); // ftrace formats
        at += 8 + 2;
        assert_eq!(rd_u32(&b, &mut at), 1); // systems
        assert_eq!(&b[at..at + 6], b"sched\0");
        at += 6;
        assert_eq!(rd_u32(&b, &mut at), 2);
        at += 8 + 2 + 8 + 3;
        let ksyms = rd_u32(&b, &mut at) as usize;
        at += ksyms;
        assert_eq!(rd_u32(&b, &mut at), 0); // printk
        let cmdlines = rd_u64(&b, &mut at) as usize;
        at += cmdlines;
        assert_eq!(rd_u32(&b, &mut at), 2); // cpus
        assert_eq!(&b[at..at + 10], b"options  \0");
        at += 10;
        let mut ids = Vec::new();
        loop {
            let id = u16::from_ne_bytes(b[at..at + 2].try_into().unwrap());
            at += 2;
            if id == 0 {
                break;
            }
            let len = rd_u32(&b, &mut at) as usize;
            ids.push((id, b[at..at + len].to_vec()));
            at += len;
        }
        assert_eq!(ids[0], (OPTION_TRACECLOCK, b"[mono]\0".to_vec()));
        assert_eq!(ids[1].0, OPTION_UNAME);
        assert_eq!(ids[2], (OPTION_CPUSTAT, b"CPU: 0\nentries: 0\n\0".to_vec()));
        assert_eq!(&b[at..at + 10], b"flyrecord\0");
        at += 10;
        let (off0, size0) = (rd_u64(&b, &mut at), rd_u64(&b, &mut at));
        let (off1, size1) = (rd_u64(&b, &mut at), rd_u64(&b, &mut at));
        assert_eq!(rd_u64(&b, &mut at), 6);
        assert_eq!(&b[at..at + 6], b"[mono]");
        assert_eq!((off0 % 4096, size0), (0, 8192));
        assert_eq!((off1, size1), (off0 + 8192, 0));
        assert!(b[off0 as usize..(off0 + size0) as usize]
            .iter()
            .all(|&x| x == 0xab));
    }

    #[test]
    fn rejects_partial_pages_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let cpu0 = dir.path().join("cpu0.raw");
        fs::write(&cpu0, vec![0u8; 100]).unwrap();
        let out = dir.path().join("trace.dat");
        let err = write_trace_dat(&out, &meta(), &[cpu0]).unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
        assert!(!out.exists() && !partial_path(&out).exists());
    }

    #[test]
    fn missing_cpu_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("trace.dat");
        let err = write_trace_dat(&out, &meta(), &[dir.path().join("nope.raw")]).unwrap_err();
        assert!(err.to_string().contains("nope.raw"), "{err}");
    }

    #[test]
    fn rejects_bad_page_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = meta();
        m.page_size = 3000;
        let err = write_trace_dat(&dir.path().join("t.dat"), &m, &[]).unwrap_err();
        assert!(err.to_string().contains("power of two"), "{err}");
    }
}
