//! Opening a trace.dat file: the header, the metadata (formats, cmdlines,
//! options) and where each CPU's data is, for file versions 6 and 7.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use deepspan_model::Name;

use crate::compress::Codec;
use crate::error::{Error, Location};
use crate::format::{parse_event_format, parse_field_lines, EventFormat};
use crate::ring::{CpuRecords, CpuSpan, PageLayout, Records, TsConv};
use crate::schema::{parse_printk, Schema};
use crate::source::{Cursor, Endian, Origin, Source};
use crate::truncation::{CpuCut, Truncation};

const MAGIC: &[u8] = b"\x17\x08\x44tracing";

// Option ids (trace-cmd's TRACECMD_OPTION_*).
const OPT_DONE: u16 = 0;
const OPT_DATE: u16 = 1;
const OPT_BUFFER: u16 = 3;
const OPT_TRACECLOCK: u16 = 4;
const OPT_UNAME: u16 = 5;
const OPT_OFFSET: u16 = 7;
const OPT_CPUCOUNT: u16 = 8;
const OPT_TSC2NSEC: u16 = 14;
const OPT_HEADER_INFO: u16 = 16;
const OPT_FTRACE_EVENTS: u16 = 17;
const OPT_EVENT_FORMATS: u16 = 18;
const OPT_PRINTK: u16 = 20;
const OPT_CMDLINES: u16 = 21;

/// v7 section ids are the ids of the options that point to them.
const SECTION_OPTIONS: u16 = OPT_DONE;
const SECTION_BUFFER: u16 = OPT_BUFFER;
const SECTION_FLAG_COMPRESSED: u16 = 1;

/// Pages at the end of a cut CPU's data searched for its last record.
const LAST_PAGES_SEARCHED: u64 = 256;

/// Largest page (sub-buffer) size accepted.
const MAX_PAGE_SIZE: u32 = 64 << 20;

/// An opened trace.dat file (version 6 or 7, any byte order, compressed or
/// not).
///
/// Opening reads the metadata only; the ring-buffer data is read when
/// iterated, in bounded chunks, so files of any size can be decoded.
///
/// Timestamps are those `trace-cmd report` prints: the ring-buffer clock,
/// scaled by the TSC2NSEC option when present, plus the offsets of the
/// DATE and OFFSET options (see [`TraceDat::ts_offset`]). Guest/host time
/// synchronisation (TIME_SHIFT) is not applied.
#[derive(Debug)]
pub struct TraceDat {
    src: Arc<Source>,
    version: u32,
    endian: Endian,
    long_size: u32,
    page_size: u32,
    layout: PageLayout,
    compression: Option<String>,
    clock: Option<String>,
    uname: Option<String>,
    schema: Arc<Schema>,
    cmdlines: HashMap<i32, String>,
    cpus: u32,
    /// `buffers[0]` is the top instance; the others are named instances.
    buffers: Vec<Buffer>,
    ts_conv: TsConv,
    /// Boxed: only cut files have one, and it would make every trace larger.
    truncation: Option<Box<Truncation>>,
}

#[derive(Debug, Default)]
struct Buffer {
    name: String,
    page_size: u32,
    spans: Vec<CpuSpan>,
}

/// What the options say (in v6 a header part, in v7 a chain of sections).
#[derive(Default)]
struct Options {
    ts_offset: i64,
    tsc: Option<(u32, u32)>,
    has_trace_clock: bool,
    trace_clock_text: Option<String>,
    uname: Option<String>,
    cpu_count: Option<u32>,
    buffers: Vec<BufferOption>,
    /// v7: file offsets of the metadata sections, by id.
    sections: HashMap<u16, u64>,
}

struct BufferOption {
    name: String,
    offset: u64,
    clock: Option<String>,
    page_size: Option<u32>,
    cpus: Vec<(u32, u64, u64)>,
    at: Location,
}

impl TraceDat {
    /// Opens a trace.dat file and reads its metadata.
    pub fn open(path: &Path) -> Result<TraceDat, Error> {
        let open_err = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        TraceDat::from_source(Source::File { file, len })
    }

    /// Reads a trace.dat file held in memory (records then share its
    /// buffer instead of copying).
    pub fn from_bytes(data: impl Into<Bytes>) -> Result<TraceDat, Error> {
        TraceDat::from_source(Source::Memory(data.into()))
    }

    fn from_source(src: Source) -> Result<TraceDat, Error> {
        let mut c = Cursor::new(&src, 0, Endian { big: false }, Origin::File);
        let (version, endian, long_size, page_size, page_at) =
            read_file_header(&mut c).map_err(|e| {
                if c.ran_out() {
                    essential_cut(src.len(), "file header", e)
                } else {
                    e
                }
            })?;

        let mut meta = Meta::default();
        let (options, top, instances, meta_cut) = if version == 6 {
            read_v6(&mut c, &mut meta, long_size, page_size)?
        } else {
            let (options, top, instances) =
                read_v7(&mut c, endian, long_size, page_size, &mut meta)?;
            (options, top, instances, MetaCut::default())
        };
        let layout = meta.layout.ok_or_else(|| {
            Error::malformed(
                Location::File(0),
                "no header_page (the ring-buffer page layout)",
            )
        })?;
        if (page_size as usize) <= layout.data_off {
            return Err(Error::malformed(
                page_at,
                format!(
                    "page size {page_size} leaves no room after the {}-byte page header",
                    layout.data_off
                ),
            ));
        }
        let mut buffers = vec![top];
        buffers.extend(instances);
        for b in &buffers {
            if (b.page_size as usize) <= layout.data_off {
                return Err(Error::malformed(
                    page_at,
                    format!(
                        "buffer {:?}: page size {} is too small",
                        b.name, b.page_size
                    ),
                ));
            }
        }
        let max_cpu = buffers[0]
            .spans
            .iter()
            .map(|s| s.cpu.saturating_add(1))
            .max()
            .unwrap_or(0);
        let cpus = options
            .cpu_count
            .unwrap_or(0)
            .max(max_cpu)
            .max(meta.header_cpus);
        let clock = options
            .buffers
            .iter()
            .find(|b| b.name.is_empty())
            .and_then(|b| b.clock.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| options.trace_clock_text.as_deref().and_then(current_clock));
        let schema = Schema::with_printk(
            std::mem::take(&mut meta.formats),
            endian,
            layout.commit_size,
            std::mem::take(&mut meta.printk),
        );
        let mut trace = TraceDat {
            src: Arc::new(src),
            version,
            endian,
            long_size,
            page_size,
            layout,
            compression: meta.compression,
            clock,
            uname: options.uname,
            schema: Arc::new(schema),
            cmdlines: meta.cmdlines,
            cpus,
            buffers,
            ts_conv: TsConv {
                tsc: options.tsc,
                offset: options.ts_offset,
            },
            truncation: None,
        };
        trace.truncation = trace.clamp_to_file(meta_cut)?.map(Box::new);
        Ok(trace)
    }

    /// Cuts the CPU data that runs past the end of the file back to its
    /// whole pages, and says what was lost; `None` for a whole file.
    fn clamp_to_file(&mut self, meta_cut: MetaCut) -> Result<Option<Truncation>, Error> {
        let file_len = self.src.len();
        let mut expected = file_len;
        // (cpu, declared bytes, kept bytes) of the top instance.
        let mut cut_cpus = Vec::new();
        for (index, buffer) in self.buffers.iter_mut().enumerate() {
            let page = u64::from(buffer.page_size);
            // Compressed (v7) data is read chunk by chunk, whose headers
            // say where it ends; trace-cmd writes the CPU table after it,
            // so a cut there never gets this far.
            for span in buffer.spans.iter_mut().filter(|s| s.codec.is_none()) {
                let end = span
                    .offset
                    .checked_add(span.size)
                    .ok_or_else(|| Error::Cpu {
                        at: Location::File(span.offset),
                        cpu: span.cpu,
                        what: format!(
                            "data of {} bytes at offset {:#x} would end past any possible file",
                            span.size, span.offset
                        ),
                    })?;
                if end <= file_len {
                    continue;
                }
                expected = expected.max(end);
                let kept = file_len.saturating_sub(span.offset).min(span.size) / page * page;
                if index == 0 {
                    cut_cpus.push((span.cpu, span.size, kept));
                }
                span.size = kept;
            }
        }
        if expected == file_len && meta_cut.part.is_none() && meta_cut.instances_lost.is_empty() {
            return Ok(None);
        }
        cut_cpus.sort_unstable();
        let cpus = cut_cpus
            .into_iter()
            .map(|(cpu, declared_bytes, kept_bytes)| CpuCut {
                cpu,
                declared_bytes,
                kept_bytes,
                last_kept_ns: self.last_record_ts(cpu),
                lost_from_ns: self.page_ts_at(cpu, kept_bytes),
            })
            .collect();
        Ok(Some(Truncation {
            present_bytes: file_len,
            expected_bytes: meta_cut.part.is_none().then_some(expected),
            cut_in: meta_cut.part.unwrap_or("CPU data"),
            cpus,
            instances_lost: meta_cut.instances_lost,
        }))
    }

    /// Time of the last record of a (clamped) CPU of the top instance,
    /// looked for in its last [`LAST_PAGES_SEARCHED`] pages.
    fn last_record_ts(&self, cpu: u32) -> Option<u64> {
        let buffer = &self.buffers[0];
        let span = buffer.spans.iter().find(|s| s.cpu == cpu).copied()?;
        let page = u64::from(buffer.page_size);
        let total = (span.size / page).min(LAST_PAGES_SEARCHED);
        let mut pages = 1;
        while pages <= total {
            let tail = CpuSpan {
                offset: span.offset + span.size - pages * page,
                size: pages * page,
                ..span
            };
            let buffer_tail = Buffer {
                name: String::new(),
                page_size: buffer.page_size,
                spans: vec![tail],
            };
            let last = self
                .cpu_iter(&buffer_tail, cpu)
                .map_while(Result::ok)
                .last();
            if let Some(record) = last {
                return Some(record.ts);
            }
            if pages == total {
                break;
            }
            pages = (pages * 4).min(total);
        }
        None
    }

    /// Time of the page header at `offset` bytes into a CPU's data of the
    /// top instance, when the file holds it.
    fn page_ts_at(&self, cpu: u32, offset: u64) -> Option<u64> {
        let span = self.buffers[0].spans.iter().find(|s| s.cpu == cpu)?;
        let raw = self
            .src
            .read(span.offset.checked_add(offset)?, 8, "page header")
            .ok()?;
        let raw = self.endian.u64(raw[..].try_into().ok()?);
        Some(self.ts_conv.apply(raw))
    }

    /// How the file is cut short, when it is: the ring-buffer data before
    /// the cut is decoded (whole pages only) and this says what is lost,
    /// so that a reader can warn instead of refusing the trace.
    pub fn truncation(&self) -> Option<&Truncation> {
        self.truncation.as_deref()
    }

    /// The file format version: 6 or 7.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Number of CPUs of the traced machine (at least one more than the
    /// highest CPU with data).
    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    /// The ring-buffer page (sub-buffer) size of the top instance, in bytes.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Size of `long` in bytes as the file header states it (the recording
    /// tool's user space; the kernel's is [`Schema::long_size`]).
    pub fn long_size(&self) -> u32 {
        self.long_size
    }

    pub fn big_endian(&self) -> bool {
        self.endian.big
    }

    /// The trace clock (`local`, `mono`, `global`, ...), when saved.
    pub fn clock(&self) -> Option<&str> {
        self.clock.as_deref()
    }

    /// The compression algorithm of a v7 file (`zstd`, `zlib`, `none`).
    pub fn compression(&self) -> Option<&str> {
        self.compression.as_deref()
    }

    /// `uname -a` of the traced machine, when saved.
    pub fn uname(&self) -> Option<&str> {
        self.uname.as_deref()
    }

    /// Nanoseconds added to every timestamp (from the DATE and OFFSET
    /// options; 0 for most traces).
    pub fn ts_offset(&self) -> i64 {
        self.ts_conv.offset
    }

    pub fn schema(&self) -> &Arc<Schema> {
        &self.schema
    }

    /// The saved command lines: thread id -> comm.
    pub fn cmdlines(&self) -> &HashMap<i32, String> {
        &self.cmdlines
    }

    /// Bytes of ring-buffer data of the top instance as stored in the file
    /// (compressed size for compressed files); [`Records::bytes_read`]
    /// counts towards it.
    pub fn cpu_data_bytes(&self) -> u64 {
        // Sizes come from the file; a corrupt one must not overflow.
        self.buffers[0]
            .spans
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.size))
    }

    /// Bytes of one CPU's ring-buffer data of the top instance, as stored
    /// (0 for a CPU without data).
    pub fn cpu_data_bytes_of(&self, cpu: u32) -> u64 {
        self.buffers[0]
            .spans
            .iter()
            .filter(|s| s.cpu == cpu)
            .fold(0u64, |sum, s| sum.saturating_add(s.size))
    }

    /// The names of the buffer instances besides the top one.
    pub fn instances(&self) -> impl Iterator<Item = &str> {
        self.buffers[1..].iter().map(|b| b.name.as_str())
    }

    /// One CPU's records of the top instance, in order. A CPU without data
    /// gives no records.
    pub fn cpu_records(&self, cpu: u32) -> Result<CpuRecords, Error> {
        if cpu >= self.cpus {
            return Err(Error::NoSuchCpu {
                cpu,
                cpus: self.cpus,
            });
        }
        Ok(self.cpu_iter(&self.buffers[0], cpu))
    }

    /// All records of the top instance, merged in time order (equal
    /// timestamps: lower CPU first).
    pub fn records(&self) -> Result<Records, Error> {
        Ok(self.merged(&self.buffers[0]))
    }

    /// All records of a named buffer instance, merged in time order.
    pub fn instance_records(&self, name: &str) -> Result<Records, Error> {
        let buffer = self.buffers[1..]
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| Error::NoSuchInstance {
                name: name.to_string(),
            })?;
        Ok(self.merged(buffer))
    }

    /// The ring-buffer page layout (page size of the top instance).
    pub(crate) fn layout(&self) -> PageLayout {
        PageLayout {
            page_size: self.page_size as usize,
            ..self.layout
        }
    }

    /// How raw ring-buffer times become the times records carry.
    pub(crate) fn ts_conv(&self) -> TsConv {
        self.ts_conv
    }

    /// Every buffer (the top instance first, named instances after) with
    /// its page size and where each CPU's data is.
    pub(crate) fn data_spans(&self) -> impl Iterator<Item = (&str, u32, &[CpuSpan])> {
        self.buffers
            .iter()
            .map(|b| (b.name.as_str(), b.page_size, b.spans.as_slice()))
    }

    fn merged(&self, buffer: &Buffer) -> Records {
        let mut cpus: Vec<u32> = buffer.spans.iter().map(|s| s.cpu).collect();
        cpus.sort_unstable();
        Records::new(
            cpus.into_iter()
                .map(|cpu| self.cpu_iter(buffer, cpu))
                .collect(),
        )
    }

    fn cpu_iter(&self, buffer: &Buffer, cpu: u32) -> CpuRecords {
        let span = buffer.spans.iter().find(|s| s.cpu == cpu).copied();
        let layout = PageLayout {
            page_size: buffer.page_size as usize,
            ..self.layout
        };
        CpuRecords::new(
            self.src.clone(),
            span,
            cpu,
            layout,
            self.ts_conv,
            self.schema.common_type(),
        )
    }
}

/// The initial header: magic, version, byte order, long size, page size
/// (and where the page size is, for its errors).
fn read_file_header(c: &mut Cursor) -> Result<(u32, Endian, u32, u32, Location), Error> {
    c.expect(MAGIC, "trace.dat magic")?;
    let version_at = c.location();
    let version_text = c.cstr("version string")?;
    let version: u32 = match version_text.trim().parse() {
        Ok(v @ (6 | 7)) => v,
        _ => {
            return Err(Error::Unsupported {
                at: version_at,
                what: format!("trace.dat version {version_text:?} (6 and 7 are supported)"),
            })
        }
    };
    let endian_at = c.location();
    let endian = match c.u8("endianness byte")? {
        0 => Endian { big: false },
        1 => Endian { big: true },
        other => {
            return Err(Error::malformed(
                endian_at,
                format!("endianness byte {other} (0 or 1 expected)"),
            ))
        }
    };
    c.set_endian(endian);
    let long_at = c.location();
    let long_size = u32::from(c.u8("long size")?);
    if long_size != 4 && long_size != 8 {
        return Err(Error::malformed(
            long_at,
            format!("long size {long_size} (4 or 8 expected)"),
        ));
    }
    let page_at = c.location();
    let page_size = c.u32("page size")?;
    check_page_size(page_size, page_at)?;
    Ok((version, endian, long_size, page_size, page_at))
}

fn check_page_size(page_size: u32, at: Location) -> Result<(), Error> {
    if page_size == 0 || page_size > MAX_PAGE_SIZE {
        return Err(Error::malformed(
            at,
            format!("page size {page_size} is implausible"),
        ));
    }
    Ok(())
}

/// Metadata gathered while reading either version.
#[derive(Default)]
struct Meta {
    layout: Option<PageLayout>,
    formats: Vec<EventFormat>,
    printk: HashMap<u64, Name>,
    cmdlines: HashMap<i32, String>,
    compression: Option<String>,
    /// v6: CPUs with data, as stated before the options.
    header_cpus: u32,
}

impl Meta {
    /// `header_page` and `header_event`: the page layout.
    fn read_header_info(
        &mut self,
        c: &mut Cursor,
        endian: Endian,
        long_size: u32,
    ) -> Result<(), Error> {
        c.expect(b"header_page\0", "header_page label")?;
        let size = c.u64("header_page size")?;
        let at = c.location();
        let text = c.bytes(size, "header_page")?;
        self.layout = Some(page_layout(
            &String::from_utf8_lossy(&text),
            endian,
            long_size,
            at,
        )?);
        c.expect(b"header_event\0", "header_event label")?;
        let size = c.u64("header_event size")?;
        c.skip(size, "header_event")?;
        Ok(())
    }

    fn long(&self) -> usize {
        self.layout.map_or(8, |l| l.commit_size)
    }

    fn read_ftrace_formats(&mut self, c: &mut Cursor) -> Result<(), Error> {
        let count = c.u32("ftrace format count")?;
        for _ in 0..count {
            self.read_format(c, "ftrace")?;
        }
        Ok(())
    }

    fn read_event_formats(&mut self, c: &mut Cursor) -> Result<(), Error> {
        let systems = c.u32("event system count")?;
        for _ in 0..systems {
            let system = c.cstr("event system name")?;
            let count = c.u32("event format count")?;
            for _ in 0..count {
                self.read_format(c, &system)?;
            }
        }
        Ok(())
    }

    fn read_format(&mut self, c: &mut Cursor, system: &str) -> Result<(), Error> {
        let size = c.u64("event format size")?;
        let at = c.location();
        let text = c.bytes(size, "event format")?;
        let format = parse_event_format(&String::from_utf8_lossy(&text), system, self.long())
            .map_err(|e| Error::malformed(at, format!("event format of system {system}: {e}")))?;
        self.formats.push(format);
        Ok(())
    }

    fn read_printk(&mut self, c: &mut Cursor) -> Result<(), Error> {
        let size = c.u32("printk formats size")?;
        let text = c.bytes(u64::from(size), "printk formats")?;
        self.printk = parse_printk(&String::from_utf8_lossy(&text));
        Ok(())
    }

    fn read_cmdlines(&mut self, c: &mut Cursor) -> Result<(), Error> {
        let size = c.u64("cmdlines size")?;
        let text = c.bytes(size, "cmdlines")?;
        for line in String::from_utf8_lossy(&text).lines() {
            if let Some((pid, comm)) = line.trim_start().split_once(' ') {
                if let Ok(pid) = pid.parse::<i32>() {
                    self.cmdlines.insert(pid, comm.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The page layout from `header_page`. Falls back to the usual layout (u64
/// timestamp, `long` commit, data) when the text does not describe it.
fn page_layout(
    text: &str,
    endian: Endian,
    long_size: u32,
    at: Location,
) -> Result<PageLayout, Error> {
    let fields = parse_field_lines(text, long_size as usize)
        .map_err(|(line, what)| Error::malformed(at, format!("header_page line {line}: {what}")))?;
    let find = |name: &str| fields.iter().find(|f| f.name == name);
    let long = long_size as usize;
    let (commit_off, commit_size, data_off) =
        match (find("timestamp"), find("commit"), find("data")) {
            (Some(ts), Some(commit), Some(data)) => {
                if ts.offset != 0 || ts.size != 8 {
                    return Err(Error::Unsupported {
                        at,
                        what: format!("page timestamp at offset {} of size {}", ts.offset, ts.size),
                    });
                }
                (commit.offset, commit.size, data.offset)
            }
            _ => (8, long, 8 + long),
        };
    if !matches!(commit_size, 4 | 8) || commit_off < 8 || commit_off + commit_size > data_off {
        return Err(Error::malformed(
            at,
            format!("header_page: commit at offset {commit_off} of size {commit_size}, data at {data_off}"),
        ));
    }
    Ok(PageLayout {
        page_size: 0,
        commit_off,
        commit_size,
        data_off,
        endian,
    })
}

/// Where a file that ends early was cut, found while reading its metadata:
/// the part the cut is in (none when the metadata is whole), and the named
/// instances whose CPU table lies past the end.
#[derive(Default)]
struct MetaCut {
    part: Option<&'static str>,
    instances_lost: Vec<String>,
}

/// The error for a file cut inside a part needed to decode anything.
fn essential_cut(file_len: u64, part: &str, e: Error) -> Error {
    Error::malformed(
        Location::File(file_len),
        format!("the file is cut short at byte {file_len} inside the {part}: no event can be decoded ({e})"),
    )
}

/// v6: everything is in one sequence after the initial header.
fn read_v6(
    c: &mut Cursor,
    meta: &mut Meta,
    long_size: u32,
    page_size: u32,
) -> Result<(Options, Buffer, Vec<Buffer>, MetaCut), Error> {
    let endian = c.endian();
    let file_len = c.source().len();
    let cut = |c: &Cursor, part: &str, e: Error| {
        if c.ran_out() {
            essential_cut(file_len, part, e)
        } else {
            e
        }
    };
    meta.read_header_info(c, endian, long_size)
        .map_err(|e| cut(c, "header page", e))?;
    meta.read_ftrace_formats(c)
        .map_err(|e| cut(c, "ftrace event formats", e))?;
    meta.read_event_formats(c)
        .map_err(|e| cut(c, "event formats", e))?;

    // The rest is not needed to decode events: a cut here leaves a trace
    // without ring-buffer data (and perhaps without names), not an error.
    let mut part = "kallsyms";
    let mut options = Options::default();
    let mut instances_lost = Vec::new();
    match read_v6_tail(
        c,
        meta,
        page_size,
        &mut options,
        &mut part,
        &mut instances_lost,
    ) {
        Ok((top, instances)) => Ok((
            options,
            top,
            instances,
            MetaCut {
                part: None,
                instances_lost,
            },
        )),
        Err(_) if c.ran_out() => {
            let top = Buffer {
                name: String::new(),
                page_size,
                spans: Vec::new(),
            };
            let cut = MetaCut {
                part: Some(part),
                instances_lost: Vec::new(),
            };
            Ok((options, top, Vec::new(), cut))
        }
        Err(e) => Err(e),
    }
}

/// v6 after the event formats: kallsyms, printk formats, cmdlines, options
/// and the CPU table. `part` follows what is being read, for a cut.
fn read_v6_tail(
    c: &mut Cursor,
    meta: &mut Meta,
    page_size: u32,
    options: &mut Options,
    part: &mut &'static str,
    instances_lost: &mut Vec<String>,
) -> Result<(Buffer, Vec<Buffer>), Error> {
    *part = "kallsyms";
    let size = c.u32("kallsyms size")?;
    c.skip(u64::from(size), "kallsyms")?;
    *part = "printk formats";
    meta.read_printk(c)?;
    *part = "cmdlines";
    meta.read_cmdlines(c)?;
    *part = "CPU count";
    let cpus = c.u32("CPU count")?;
    meta.header_cpus = cpus;

    *part = "options";
    let mut marker_at = c.location();
    let mut marker = c.bytes(10, "data type label")?;
    if marker[..] == b"options  \0"[..] {
        read_options(c, false, options)?;
        marker_at = c.location();
        marker = c.bytes(10, "data type label")?;
    }
    match &marker[..] {
        b"flyrecord\0" => {}
        b"latency  \0" => {
            return Err(Error::Unsupported {
                at: marker_at,
                what: "latency (text) trace data".into(),
            })
        }
        other => {
            return Err(Error::malformed(
                marker_at,
                format!(
                    "expected \"flyrecord\" or \"options\", found {:?}",
                    String::from_utf8_lossy(other)
                ),
            ))
        }
    }
    *part = "CPU table";
    let top = read_v6_flyrecord(c, "", cpus, page_size, options)?;
    let mut instances = Vec::new();
    for b in options.buffers.iter().filter(|b| !b.name.is_empty()) {
        let mut ic = Cursor::new_like(c, b.offset);
        let mut scratch = Options {
            has_trace_clock: options.has_trace_clock,
            ..Options::default()
        };
        let instance = ic
            .expect(b"flyrecord\0", "instance data label")
            .and_then(|()| read_v6_flyrecord(&mut ic, &b.name, cpus, page_size, &mut scratch));
        match instance {
            Ok(buffer) => instances.push(buffer),
            // Past the end of a cut file: known by its name, without data.
            Err(_) if ic.ran_out() => {
                instances_lost.push(b.name.clone());
                instances.push(Buffer {
                    name: b.name.clone(),
                    page_size,
                    spans: Vec::new(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok((top, instances))
}

/// The CPU offset/size table after a v6 "flyrecord" label, and the clock
/// after it when the TRACECLOCK option is present.
fn read_v6_flyrecord(
    c: &mut Cursor,
    name: &str,
    cpus: u32,
    page_size: u32,
    options: &mut Options,
) -> Result<Buffer, Error> {
    let mut spans = Vec::new();
    for cpu in 0..cpus {
        let offset = c.u64("CPU data offset")?;
        let size = c.u64("CPU data size")?;
        spans.push(CpuSpan {
            cpu,
            offset,
            size,
            codec: None,
        });
    }
    if options.has_trace_clock {
        // trace-cmd had a bug that could corrupt this; like trace-cmd,
        // do without the clock rather than fail.
        let at = c.pos();
        let clock = (|| -> Result<String, Error> {
            let size = c.u64("trace clock size")?;
            if size > 4096 {
                return Err(c.error("trace clock text too long"));
            }
            Ok(String::from_utf8_lossy(&c.bytes(size, "trace clock")?).into_owned())
        })();
        match clock {
            Ok(text) => options.trace_clock_text = Some(text),
            Err(_) => c.seek(at),
        }
    }
    Ok(Buffer {
        name: name.to_string(),
        page_size,
        spans,
    })
}

/// The "[current] other ..." format of the trace_clock file -> "current".
fn current_clock(text: &str) -> Option<String> {
    let text = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    if let Some(start) = text.find('[') {
        let rest = &text[start + 1..];
        return rest
            .find(']')
            .map(|end| rest[..end].to_string())
            .filter(|s| !s.is_empty());
    }
    text.split_whitespace().next().map(str::to_string)
}

/// Reads options until DONE. v7 returns the offset of the next options
/// section (0: none).
fn read_options(c: &mut Cursor, v7: bool, o: &mut Options) -> Result<u64, Error> {
    loop {
        let id = c.u16("option id")?;
        if !v7 && id == OPT_DONE {
            return Ok(0);
        }
        let size = c.u32("option size")?;
        let at = c.location();
        let data = c.bytes(u64::from(size), "option data")?;
        let e = c.endian();
        let u32_at = |i: usize| data.get(i..i + 4).map(|b| e.u32([b[0], b[1], b[2], b[3]]));
        let u64_at = |i: usize| {
            data.get(i..i + 8)
                .map(|b| e.u64([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        };
        match id {
            OPT_DONE => {
                return u64_at(0)
                    .ok_or_else(|| Error::malformed(at, "DONE option shorter than 8 bytes"))
            }
            OPT_DATE => {
                // Microseconds between the trace clock and wall time.
                if let Some(us) = parse_c_int(&c_string(&data)) {
                    o.ts_offset = o.ts_offset.wrapping_add(us.wrapping_mul(1000));
                }
            }
            OPT_OFFSET => {
                if let Some(ns) = parse_c_int(&c_string(&data)) {
                    o.ts_offset = o.ts_offset.wrapping_add(ns);
                }
            }
            OPT_BUFFER => o.buffers.push(parse_buffer_option(&data, v7, e, at)?),
            OPT_TRACECLOCK => {
                o.has_trace_clock = true;
                if !data.is_empty() {
                    o.trace_clock_text = Some(c_string(&data));
                }
            }
            OPT_UNAME => o.uname = Some(c_string(&data)),
            OPT_CPUCOUNT => o.cpu_count = u32_at(0),
            OPT_TSC2NSEC => {
                if let (Some(mult), Some(shift)) = (u32_at(0), u32_at(4)) {
                    if shift >= 64 {
                        return Err(Error::malformed(
                            at,
                            format!("TSC2NSEC shift {shift} out of range"),
                        ));
                    }
                    o.tsc = Some((mult, shift));
                }
            }
            OPT_HEADER_INFO..=OPT_CMDLINES if v7 => {
                if let Some(offset) = u64_at(0) {
                    o.sections.insert(id, offset);
                }
            }
            // Everything else (CPUSTAT, HOOK, VERSION, PROCMAPS, TRACEID,
            // TIME_SHIFT, GUEST, latency BUFFER_TEXT, ...) is not needed to
            // decode records; unknown ids are skipped by their size.
            _ => {}
        }
    }
}

/// A NUL-terminated string in option data (all of it when there is no NUL).
fn c_string(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// `strtoll(s, NULL, 0)`: decimal, 0x hex or 0 octal, with a sign.
fn parse_c_int(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()?
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()?
    } else {
        s.parse::<u64>().ok()?
    } as i64;
    Some(if neg { v.wrapping_neg() } else { v })
}

/// BUFFER option: v6 holds offset and name; v7 adds the clock, (in newer
/// trace-cmd) the page size, and the CPU table.
fn parse_buffer_option(
    data: &[u8],
    v7: bool,
    e: Endian,
    at: Location,
) -> Result<BufferOption, Error> {
    let short = || Error::malformed(at, "BUFFER option is truncated");
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8], Error> {
        let b = data.get(pos..pos + n).ok_or_else(short)?;
        pos += n;
        Ok(b)
    };
    let b = take(8)?;
    let offset = e.u64([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let cstr = |pos: &mut usize| -> Result<String, Error> {
        let rest = data.get(*pos..).ok_or_else(short)?;
        let end = rest.iter().position(|&b| b == 0).ok_or_else(short)?;
        *pos += end + 1;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    };
    let name = cstr(&mut pos)?;
    let mut option = BufferOption {
        name,
        offset,
        clock: None,
        page_size: None,
        cpus: Vec::new(),
        at,
    };
    if !v7 {
        return Ok(option);
    }
    option.clock = Some(cstr(&mut pos)?);
    let rest = &data[pos.min(data.len())..];
    let word = |i: usize| rest.get(i..i + 4).map(|b| e.u32([b[0], b[1], b[2], b[3]]));
    // Older writers put the CPU count right after the clock, newer ones a
    // page size first. Entries are 20 bytes, so only one reading fits.
    let entries_fit = |count: Option<u32>, head: usize| {
        count.is_some_and(|n| rest.len() >= head && (rest.len() - head) as u64 == u64::from(n) * 20)
    };
    let head = if entries_fit(word(4), 8) {
        option.page_size = word(0);
        8
    } else if entries_fit(word(0), 4) {
        4
    } else {
        return Err(Error::malformed(
            at,
            format!(
                "BUFFER option: CPU table of {} bytes does not match its CPU count",
                rest.len()
            ),
        ));
    };
    for entry in rest[head..].chunks_exact(20) {
        let cpu = e.u32([entry[0], entry[1], entry[2], entry[3]]);
        let off = e.u64(entry[4..12].try_into().map_err(|_| short())?);
        let size = e.u64(entry[12..20].try_into().map_err(|_| short())?);
        option.cpus.push((cpu, off, size));
    }
    Ok(option)
}

/// v7: the header points to a chain of options sections, which point to
/// the metadata sections and describe the buffers.
fn read_v7(
    c: &mut Cursor,
    endian: Endian,
    long_size: u32,
    page_size: u32,
    meta: &mut Meta,
) -> Result<(Options, Buffer, Vec<Buffer>), Error> {
    let src = c.source();
    let cut = |c: &Cursor, e: Error| {
        if c.ran_out() {
            essential_cut(src.len(), "file header", e)
        } else {
            e
        }
    };
    let name_at = c.location();
    let name = c.cstr("compression name").map_err(|e| cut(c, e))?;
    let _version = c.cstr("compression version").map_err(|e| cut(c, e))?;
    let codec = Codec::from_name(&name).map_err(|what| Error::Unsupported { at: name_at, what })?;
    meta.compression = Some(name);
    let mut next = c
        .u64("offset of the first options section")
        .map_err(|e| cut(c, e))?;

    let mut options = Options::default();
    let mut seen = HashSet::new();
    while next != 0 {
        if !seen.insert(next) || seen.len() > 4096 {
            return Err(Error::malformed(
                Location::File(next),
                "options sections form a loop",
            ));
        }
        let at = next;
        next = with_section(src, endian, codec, at, SECTION_OPTIONS, "options", |c| {
            read_options(c, true, &mut options)
        })
        .map_err(|e| v7_cut(src, endian, at, "options", e))?;
    }

    let section = |id: u16| options.sections.get(&id).copied();
    let header_at = section(OPT_HEADER_INFO).ok_or_else(|| {
        Error::malformed(Location::File(0), "no HEADER_INFO option (page layout)")
    })?;
    with_section(
        src,
        endian,
        codec,
        header_at,
        OPT_HEADER_INFO,
        "header info",
        |c| meta.read_header_info(c, endian, long_size),
    )
    .map_err(|e| v7_cut(src, endian, header_at, "header info", e))?;
    if let Some(at) = section(OPT_FTRACE_EVENTS) {
        with_section(
            src,
            endian,
            codec,
            at,
            OPT_FTRACE_EVENTS,
            "ftrace formats",
            |c| meta.read_ftrace_formats(c),
        )
        .map_err(|e| v7_cut(src, endian, at, "ftrace formats", e))?;
    }
    if let Some(at) = section(OPT_EVENT_FORMATS) {
        with_section(
            src,
            endian,
            codec,
            at,
            OPT_EVENT_FORMATS,
            "event formats",
            |c| meta.read_event_formats(c),
        )
        .map_err(|e| v7_cut(src, endian, at, "event formats", e))?;
    }
    if let Some(at) = section(OPT_PRINTK) {
        with_section(src, endian, codec, at, OPT_PRINTK, "printk formats", |c| {
            meta.read_printk(c)
        })
        .map_err(|e| v7_cut(src, endian, at, "printk formats", e))?;
    }
    if let Some(at) = section(OPT_CMDLINES) {
        with_section(src, endian, codec, at, OPT_CMDLINES, "cmdlines", |c| {
            meta.read_cmdlines(c)
        })
        .map_err(|e| v7_cut(src, endian, at, "cmdlines", e))?;
    }

    let mut top = Buffer {
        name: String::new(),
        page_size,
        spans: Vec::new(),
    };
    let mut instances = Vec::new();
    for b in &options.buffers {
        let header = read_section_header(src, endian, b.offset)?;
        if header.id != SECTION_BUFFER {
            return Err(Error::malformed(
                Location::File(b.offset),
                format!(
                    "BUFFER option points to a section of id {} (3 expected)",
                    header.id
                ),
            ));
        }
        let compressed = header.flags & SECTION_FLAG_COMPRESSED != 0;
        let codec = match (compressed, codec) {
            (false, _) => None,
            (true, Some(codec)) => Some(codec),
            (true, None) => {
                return Err(Error::malformed(
                    Location::File(b.offset),
                    "compressed buffer section in a file without compression",
                ))
            }
        };
        let page_size = b.page_size.unwrap_or(page_size);
        check_page_size(page_size, b.at)?;
        let mut spans: Vec<CpuSpan> = Vec::with_capacity(b.cpus.len());
        for &(cpu, offset, size) in &b.cpus {
            if spans.iter().any(|s| s.cpu == cpu) {
                return Err(Error::malformed(
                    b.at,
                    format!("BUFFER option lists CPU {cpu} twice"),
                ));
            }
            spans.push(CpuSpan {
                cpu,
                offset,
                size,
                codec,
            });
        }
        let buffer = Buffer {
            name: b.name.clone(),
            page_size,
            spans,
        };
        if b.name.is_empty() {
            top = buffer;
        } else {
            instances.push(buffer);
        }
    }
    Ok((options, top, instances))
}

/// Restates the error of a v7 section that runs past the end of the file
/// as a cut: trace-cmd writes the CPU table in the last options section,
/// after the ring-buffer data, so a v7 file cut anywhere has lost it.
fn v7_cut(src: &Source, endian: Endian, at: u64, what: &str, e: Error) -> Error {
    let len = src.len();
    let past_end = match read_section_header(src, endian, at) {
        Ok(h) => at.saturating_add(SECTION_HEADER_LEN).saturating_add(h.size) > len,
        Err(_) => at.saturating_add(SECTION_HEADER_LEN) > len,
    };
    if !past_end {
        return e;
    }
    Error::malformed(
        Location::File(len),
        format!(
            "the file is cut short at byte {len} inside the {what} section at offset {at:#x}: \
             a v7 file keeps its CPU table at its end, so no ring-buffer data can be located ({e})"
        ),
    )
}

struct SectionHeader {
    id: u16,
    flags: u16,
    size: u64,
}

const SECTION_HEADER_LEN: u64 = 2 + 2 + 4 + 8;

fn read_section_header(src: &Source, endian: Endian, at: u64) -> Result<SectionHeader, Error> {
    let mut c = Cursor::new(src, at, endian, Origin::File);
    let id = c.u16("section id")?;
    let flags = c.u16("section flags")?;
    let _description = c.u32("section description string id")?;
    let size = c.u64("section size")?;
    Ok(SectionHeader { id, flags, size })
}

/// Runs `f` on the content of the section at `at` (decompressed if needed).
fn with_section<T>(
    src: &Source,
    endian: Endian,
    codec: Option<Codec>,
    at: u64,
    id: u16,
    what: &str,
    f: impl FnOnce(&mut Cursor) -> Result<T, Error>,
) -> Result<T, Error> {
    let header = read_section_header(src, endian, at)?;
    if header.id != id {
        return Err(Error::malformed(
            Location::File(at),
            format!(
                "expected the {what} section (id {id}), found a section of id {}",
                header.id
            ),
        ));
    }
    let data_at = at + SECTION_HEADER_LEN;
    if header.flags & SECTION_FLAG_COMPRESSED == 0 {
        let mut c = Cursor::new(src, data_at, endian, Origin::File);
        return f(&mut c);
    }
    let codec = codec.ok_or_else(|| {
        Error::malformed(
            Location::File(at),
            format!("compressed {what} section in a file without compression"),
        )
    })?;
    let mut c = Cursor::new(src, data_at, endian, Origin::File);
    let csize = c.u32("compressed size")?;
    let usize_ = c.u32("uncompressed size")?;
    if u64::from(csize) + 8 > header.size {
        return Err(Error::malformed(
            Location::File(at),
            format!(
                "{what} section: compressed size {csize} exceeds the section size {}",
                header.size
            ),
        ));
    }
    let block_at = c.pos();
    let packed = c.bytes(u64::from(csize), "compressed section")?;
    let plain = codec
        .decompress(&packed, usize_ as usize)
        .map_err(|e| Error::malformed(Location::File(block_at), format!("{what} section: {e}")))?;
    let mem = Source::Memory(Bytes::from(plain));
    let mut c = Cursor::new(&mem, 0, endian, Origin::Block(block_at));
    f(&mut c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_and_integers_parse_like_trace_cmd() {
        assert_eq!(
            current_clock("[local] global counter\n").as_deref(),
            Some("local")
        );
        assert_eq!(
            current_clock("local global [mono] x").as_deref(),
            Some("mono")
        );
        assert_eq!(current_clock("boot\0").as_deref(), Some("boot"));
        assert_eq!(current_clock("[] x"), None);
        assert_eq!(parse_c_int("0x10"), Some(16));
        assert_eq!(parse_c_int("-0x10"), Some(-16));
        assert_eq!(parse_c_int("010"), Some(8));
        assert_eq!(parse_c_int(" 1234 "), Some(1234));
        assert_eq!(parse_c_int("junk"), None);
    }

    fn buffer_option(page_size: Option<u32>, cpus: u32) -> Vec<u8> {
        let mut d = 4096u64.to_le_bytes().to_vec();
        d.extend_from_slice(b"inst\0mono\0");
        if let Some(p) = page_size {
            d.extend_from_slice(&p.to_le_bytes());
        }
        d.extend_from_slice(&cpus.to_le_bytes());
        for cpu in 0..cpus {
            d.extend_from_slice(&(cpu * 2).to_le_bytes());
            d.extend_from_slice(&(8192 * u64::from(cpu + 1)).to_le_bytes());
            d.extend_from_slice(&4096u64.to_le_bytes());
        }
        d
    }

    #[test]
    fn buffer_option_with_and_without_page_size() {
        let e = Endian { big: false };
        let at = Location::File(0);
        for cpus in [0, 1, 3] {
            let new = parse_buffer_option(&buffer_option(Some(8192), cpus), true, e, at).unwrap();
            assert_eq!(
                (new.name.as_str(), new.clock.as_deref(), new.page_size),
                ("inst", Some("mono"), Some(8192))
            );
            assert_eq!(new.cpus.len(), cpus as usize);
            let old = parse_buffer_option(&buffer_option(None, cpus), true, e, at).unwrap();
            assert_eq!(old.page_size, None);
            assert_eq!(old.cpus, new.cpus);
        }
        let v6 = parse_buffer_option(&buffer_option(None, 2), false, e, at).unwrap();
        assert_eq!(
            (v6.offset, v6.name.as_str(), v6.cpus.len()),
            (4096, "inst", 0)
        );
        let mut bad = buffer_option(Some(4096), 2);
        bad.pop();
        assert!(parse_buffer_option(&bad, true, e, at).is_err());
        assert!(parse_buffer_option(&[1, 2, 3], true, e, at).is_err());
        assert!(parse_buffer_option(&buffer_option(None, 1)[..12], true, e, at).is_err());
    }
}
