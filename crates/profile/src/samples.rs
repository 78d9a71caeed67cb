//! `RUN/profile/`: the samples file and what symbolizing them needs later.
//!
//! - `samples.zst`: a zstd stream of [`Sample`] records (layout below), in
//!   the order the per-CPU rings were drained (not sorted by time);
//! - `maps/PID`: the executable mappings of each sampled process, in
//!   `/proc/PID/maps` line format: read from /proc on a process's first
//!   sample, plus the kernel's MMAP2 records for mappings made later;
//! - `kallsyms.zst`: `/proc/kallsyms` at the start, for kernel frames;
//! - `perf-PID.map`: copies of the perf maps JIT runtimes write in /tmp.
//!
//! A record: `time_ns u64, pid i32, tid i32, cpu u32, frames u32`, then
//! `frames` × u64 of perf's callchain (leaf first, with its
//! `PERF_CONTEXT_*` markers), all little-endian. A recorder killed mid-write
//! leaves a cut stream: reading stops at the last whole record and says so.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::Error;
use deepspan_run::profile::{KALLSYMS, SAMPLES};

/// Callchain entries above this mark the context of the frames after them
/// (`PERF_CONTEXT_KERNEL`, `PERF_CONTEXT_USER`, …), not addresses.
pub const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
pub const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
pub const PERF_CONTEXT_USER: u64 = -512i64 as u64;

/// Longest callchain kept (the kernel's default `perf_event_max_stack` is 127).
pub const MAX_FRAMES: usize = 512;

/// One CPU sample: what ran, where, and its call stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// CLOCK_MONOTONIC, the kernel trace's clock.
    pub time_ns: u64,
    pub pid: i32,
    pub tid: i32,
    pub cpu: u32,
    /// perf's callchain, leaf first, context markers included.
    pub callchain: Vec<u64>,
}

impl Sample {
    /// The frames as (address, in kernel?), leaf first, markers dropped.
    pub fn frames(&self) -> impl Iterator<Item = (u64, bool)> + '_ {
        let mut kernel = false;
        self.callchain.iter().filter_map(move |&a| {
            if a >= PERF_CONTEXT_MAX {
                kernel = a == PERF_CONTEXT_KERNEL;
                None
            } else {
                Some((a, kernel))
            }
        })
    }
}

/// Appends samples to `samples.zst`.
pub struct SampleWriter {
    out: zstd::stream::AutoFinishEncoder<'static, BufWriter<File>>,
    path: PathBuf,
    written: u64,
}

impl SampleWriter {
    pub fn create(dir: &Path) -> Result<SampleWriter, Error> {
        let path = dir.join(SAMPLES);
        let file = File::create(&path).map_err(|e| Error::io("create", &path, e))?;
        let encoder = zstd::Encoder::new(BufWriter::new(file), 3)
            .map_err(|e| Error::io("compress", &path, e))?;
        Ok(SampleWriter {
            out: encoder.auto_finish(),
            path,
            written: 0,
        })
    }

    pub fn write(&mut self, s: &Sample) -> Result<(), Error> {
        let frames = &s.callchain[..s.callchain.len().min(MAX_FRAMES)];
        let mut record = Vec::with_capacity(24 + 8 * frames.len());
        record.extend_from_slice(&s.time_ns.to_le_bytes());
        record.extend_from_slice(&s.pid.to_le_bytes());
        record.extend_from_slice(&s.tid.to_le_bytes());
        record.extend_from_slice(&s.cpu.to_le_bytes());
        record.extend_from_slice(&(frames.len() as u32).to_le_bytes());
        for f in frames {
            record.extend_from_slice(&f.to_le_bytes());
        }
        self.out
            .write_all(&record)
            .map_err(|e| Error::io("write", &self.path, e))?;
        self.written += 1;
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Pushes what is buffered to the file (a complete zstd block), so a
    /// recorder killed later loses at most what came after.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.out
            .flush()
            .map_err(|e| Error::io("write", &self.path, e))
    }
}

/// The samples of a run, and whether the file was cut short.
#[derive(Debug, Default)]
pub struct Samples {
    pub samples: Vec<Sample>,
    /// Set when the stream ended inside a record or a zstd frame (a recorder
    /// killed while writing): what it says for the analysis notes.
    pub truncated: Option<String>,
}

/// Reads `dir/samples.zst` whole.
pub fn read_samples(dir: &Path) -> Result<Samples, Error> {
    let path = dir.join(SAMPLES);
    let file = File::open(&path).map_err(|e| Error::io("open", &path, e))?;
    let mut decoder = zstd::Decoder::new(file).map_err(|e| Error::io("read", &path, e))?;
    let mut bytes = Vec::new();
    let cut = decoder.read_to_end(&mut bytes).err();
    let mut samples = Samples::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + 24) else {
            break;
        };
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
        let frames = u32_at(20) as usize;
        if frames > MAX_FRAMES {
            return Err(Error::Format {
                path,
                offset: at as u64,
                reason: format!(
                    "a sample claims {frames} frames (at most {MAX_FRAMES} are written)"
                ),
            });
        }
        let Some(chain) = bytes.get(at + 24..at + 24 + 8 * frames) else {
            break;
        };
        samples.samples.push(Sample {
            time_ns: u64::from_le_bytes(header[0..8].try_into().unwrap()),
            pid: u32_at(8) as i32,
            tid: u32_at(12) as i32,
            cpu: u32_at(16),
            callchain: chain
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        });
        at += 24 + 8 * frames;
    }
    if at < bytes.len() || cut.is_some() {
        let why = match &cut {
            Some(e) => format!("the compressed stream is cut ({e})"),
            None => format!("its last record is cut at byte {at} of {}", bytes.len()),
        };
        samples.truncated = Some(format!(
            "{}: {why}; the {} whole samples before it are used",
            path.display(),
            samples.samples.len()
        ));
    }
    Ok(samples)
}

/// Copies `/proc/kallsyms` into `dir/kallsyms.zst`.
pub fn save_kallsyms(dir: &Path) -> Result<(), Error> {
    let source = Path::new("/proc/kallsyms");
    let text = std::fs::read(source).map_err(|e| Error::io("read", source, e))?;
    let path = dir.join(KALLSYMS);
    let packed = zstd::encode_all(&text[..], 3).map_err(|e| Error::io("compress", &path, e))?;
    std::fs::write(&path, packed).map_err(|e| Error::io("write", &path, e))
}

/// The kernel symbols saved with the run, unpacked into `into` (blazesym
/// reads kallsyms from a file).
pub fn unpack_kallsyms(dir: &Path, into: &Path) -> Result<(), Error> {
    let path = dir.join(KALLSYMS);
    let packed = std::fs::read(&path).map_err(|e| Error::io("read", &path, e))?;
    let text = zstd::decode_all(&packed[..]).map_err(|e| Error::io("decompress", &path, e))?;
    std::fs::write(into, text).map_err(|e| Error::io("write", into, e))
}

pub(crate) fn append_line(path: &Path, line: &str) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: u64) -> Sample {
        Sample {
            time_ns: 1_000 + i,
            pid: 7,
            tid: 8 + i as i32,
            cpu: 1,
            callchain: vec![
                PERF_CONTEXT_KERNEL,
                0xffff_ffff_8100_0000 + i,
                PERF_CONTEXT_USER,
                0x401000,
                0x402000,
            ],
        }
    }

    #[test]
    fn samples_round_trip_and_a_cut_file_keeps_its_whole_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SampleWriter::create(dir.path()).unwrap();
        for i in 0..100 {
            w.write(&sample(i)).unwrap();
        }
        drop(w);
        let read = read_samples(dir.path()).unwrap();
        assert_eq!(read.truncated, None);
        assert_eq!(read.samples, (0..100).map(sample).collect::<Vec<_>>());
        let frames: Vec<(u64, bool)> = read.samples[0].frames().collect();
        assert_eq!(
            frames,
            vec![
                (0xffff_ffff_8100_0000, true),
                (0x401000, false),
                (0x402000, false)
            ]
        );

        // Cut inside the compressed stream: a prefix of whole samples.
        let path = dir.path().join(SAMPLES);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
        let cut = read_samples(dir.path()).unwrap();
        assert!(cut.truncated.is_some());
        assert!(cut.samples.len() < 100);
        assert_eq!(
            cut.samples,
            (0..cut.samples.len() as u64)
                .map(sample)
                .collect::<Vec<_>>()
        );
    }
}
