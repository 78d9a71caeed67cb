//! A minimal v6 trace.dat builder for tests: small files exercising what
//! real traces rarely contain (big-endian data, 4-byte kernel longs, lost
//! events, time extends, absolute timestamps, `__rel_loc`, instances).
//! Written independently of the reader's code; trace-cmd is the referee.

use deepspan_ftrace::{parse_format, ArrayLen, Dynamic};

pub const SCHED_SWITCH: &str = "name: sched_switch
ID: 372
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;

print fmt: \"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%ld ==> next_comm=%s next_pid=%d next_prio=%d\", REC->prev_comm, REC->prev_pid, REC->prev_prio, REC->prev_state, REC->next_comm, REC->next_pid, REC->next_prio
";

/// An old-kernel sched_switch: `prev_state` is an `int` (4-byte longs).
pub const SCHED_SWITCH_OLD: &str = "name: sched_switch
ID: 272
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:1;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int prev_state;\toffset:32;\tsize:4;\tsigned:1;
\tfield:char next_comm[16];\toffset:36;\tsize:16;\tsigned:1;
\tfield:pid_t next_pid;\toffset:52;\tsize:4;\tsigned:1;
\tfield:int next_prio;\toffset:56;\tsize:4;\tsigned:1;

print fmt: \"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%d ==> next_comm=%s next_pid=%d next_prio=%d\", REC->prev_comm, REC->prev_pid, REC->prev_prio, REC->prev_state, REC->next_comm, REC->next_pid, REC->next_prio
";

pub const SCHED_WAKEUP: &str = "name: sched_wakeup
ID: 375
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:int target_cpu;\toffset:32;\tsize:4;\tsigned:1;

print fmt: \"comm=%s pid=%d prio=%d target_cpu=%03d\", REC->comm, REC->pid, REC->prio, REC->target_cpu
";

pub const SCHED_PROCESS_EXEC: &str = "name: sched_process_exec
ID: 380
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;

print fmt: \"filename=%s pid=%d old_pid=%d\", __get_str(filename), REC->pid, REC->old_pid
";

pub const IRQ_HANDLER_ENTRY: &str = "name: irq_handler_entry
ID: 150
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int irq;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] name;\toffset:12;\tsize:4;\tsigned:0;

print fmt: \"irq=%d name=%s\", REC->irq, __get_str(name)
";

pub const SYS_ENTER: &str = "name: sys_enter
ID: 22
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;
\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;

print fmt: \"NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)\", REC->id, REC->args[0], REC->args[1], REC->args[2], REC->args[3], REC->args[4], REC->args[5]
";

/// A made-up event with a `__rel_loc` string, to test the relative form.
pub const REL_LOC: &str = "name: rel_event
ID: 900
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__rel_loc char[] msg;\toffset:12;\tsize:4;\tsigned:0;

print fmt: \"value=%d msg=%s\", REC->value, __get_rel_str(msg)
";

pub const PRINT: &str = "name: print
ID: 5
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;
\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;

print fmt: \"%ps: %s\", (void *)REC->ip, REC->buf
";

/// A field value for [`payload`].
#[derive(Clone, Copy, Debug)]
pub enum V<'a> {
    I(i64),
    S(&'a str),
}

/// Encodes a record of the event described by `format`; fields not given
/// are zero. Dynamic strings get their NUL, as the kernel stores them.
pub fn payload(format: &str, big: bool, values: &[(&str, V)]) -> Vec<u8> {
    let f = parse_format(format).unwrap();
    let fixed = f
        .fields
        .iter()
        .map(|x| x.offset + x.size)
        .max()
        .unwrap_or(0);
    let mut out = vec![0u8; fixed];
    let put = |out: &mut Vec<u8>, off: usize, size: usize, v: u64| {
        let bytes = if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        let b = if big {
            &bytes[8 - size..]
        } else {
            &bytes[..size]
        };
        out[off..off + size].copy_from_slice(b);
    };
    let id = f.field("common_type").unwrap();
    put(&mut out, id.offset, id.size, u64::from(f.id));
    for (name, value) in values {
        let x = f.field(name).unwrap_or_else(|| panic!("no field {name}"));
        match (value, x.dynamic, x.array) {
            (V::I(v), None, None) => put(&mut out, x.offset, x.size, *v as u64),
            (V::S(s), None, Some(ArrayLen::Fixed(_))) => {
                let n = s.len().min(x.size);
                out[x.offset..x.offset + n].copy_from_slice(&s.as_bytes()[..n]);
            }
            (V::S(s), None, Some(ArrayLen::Flexible)) => {
                out.truncate(x.offset);
                out.extend_from_slice(s.as_bytes());
                out.push(0);
            }
            (V::S(s), Some(kind), _) => {
                let start = out.len();
                out.extend_from_slice(s.as_bytes());
                out.push(0);
                let len = s.len() + 1;
                let rel = match kind {
                    Dynamic::DataLoc => start,
                    Dynamic::RelLoc => start - (x.offset + 4),
                };
                put(&mut out, x.offset, 4, ((len as u64) << 16) | rel as u64);
            }
            other => panic!("cannot encode {other:?} into {name}"),
        }
    }
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

/// One ring-buffer page being filled.
pub struct Page {
    pub ts: u64,
    big: bool,
    body: Vec<u8>,
    /// `Some(None)`: missed events, count unknown; `Some(Some(n))`: n missed.
    pub missed: Option<Option<u64>>,
}

impl Page {
    pub fn new(ts: u64, big: bool) -> Page {
        Page {
            ts,
            big,
            body: Vec::new(),
            missed: None,
        }
    }

    fn word(&mut self, w: u32) {
        let b = if self.big {
            w.to_be_bytes()
        } else {
            w.to_le_bytes()
        };
        self.body.extend_from_slice(&b);
    }

    fn header(&mut self, type_len: u32, delta: u32) {
        assert!(delta < 1 << 27 && type_len < 32);
        self.word(if self.big {
            (type_len << 27) | delta
        } else {
            (delta << 5) | type_len
        });
    }

    /// An event with its length in the type field (payload of at most 112 bytes).
    pub fn event(&mut self, delta: u32, payload: &[u8]) -> &mut Self {
        assert!(payload.len() & 3 == 0 && payload.len() <= 112 && !payload.is_empty());
        self.header(payload.len() as u32 / 4, delta);
        self.body.extend_from_slice(payload);
        self
    }

    /// An event with its length in the word after the header.
    pub fn long_event(&mut self, delta: u32, payload: &[u8]) -> &mut Self {
        assert!(payload.len() & 3 == 0);
        self.header(0, delta);
        self.word(payload.len() as u32 + 4);
        self.body.extend_from_slice(payload);
        self
    }

    /// A time extend adding `delta` (which may exceed 27 bits).
    pub fn extend(&mut self, delta: u64) -> &mut Self {
        self.header(30, (delta & ((1 << 27) - 1)) as u32);
        self.word((delta >> 27) as u32);
        self
    }

    /// An absolute timestamp (the top 5 bits come from the running time).
    pub fn absolute(&mut self, ts: u64) -> &mut Self {
        self.header(31, (ts & ((1 << 27) - 1)) as u32);
        self.word(((ts >> 27) & 0xffff_ffff) as u32);
        self
    }

    /// A discarded event of `len` payload bytes.
    pub fn discarded(&mut self, delta: u32, len: u32) -> &mut Self {
        assert!(len >= 4 && len & 3 == 0);
        self.header(29, delta);
        self.word(len);
        self.body.resize(self.body.len() + len as usize - 4, 0);
        self
    }

    /// The page bytes for a kernel `long` of `long` bytes.
    pub fn bytes(&self, page_size: usize, long: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(page_size);
        let ts = if self.big {
            self.ts.to_be_bytes()
        } else {
            self.ts.to_le_bytes()
        };
        out.extend_from_slice(&ts);
        let mut commit = self.body.len() as u64;
        match self.missed {
            Some(None) => commit |= 1 << 31,
            Some(Some(_)) => commit |= (1 << 31) | (1 << 30),
            None => {}
        }
        put_long(&mut out, commit, long, self.big);
        out.extend_from_slice(&self.body);
        if let Some(Some(n)) = self.missed {
            put_long(&mut out, n, long, self.big);
        }
        assert!(out.len() <= page_size, "page overflow");
        out.resize(page_size, 0);
        out
    }
}

fn put_long(out: &mut Vec<u8>, v: u64, long: usize, big: bool) {
    if long == 8 {
        out.extend_from_slice(&if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    } else {
        let v = v as u32;
        out.extend_from_slice(&if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }
}

/// A v6 trace.dat under construction.
pub struct Builder {
    pub big: bool,
    /// The kernel's long (commit word) size.
    pub long: usize,
    pub page_size: usize,
    /// (system, format text)
    pub formats: Vec<(String, String)>,
    pub cmdlines: String,
    pub printk: String,
    /// Raw options (id, data), written before the TRACECLOCK/BUFFER ones.
    pub options: Vec<(u16, Vec<u8>)>,
    pub clock: Option<String>,
    /// Pages per CPU of the top instance.
    pub cpus: Vec<Vec<Page>>,
    /// Named instances with their pages per CPU (same CPU count).
    pub instances: Vec<(String, Vec<Vec<Page>>)>,
}

impl Builder {
    pub fn new(big: bool, long: usize) -> Builder {
        Builder {
            big,
            long,
            page_size: 4096,
            formats: Vec::new(),
            cmdlines: String::new(),
            printk: String::new(),
            options: Vec::new(),
            clock: None,
            cpus: Vec::new(),
            instances: Vec::new(),
        }
    }

    pub fn format(&mut self, system: &str, text: &str) -> &mut Self {
        self.formats.push((system.to_string(), text.to_string()));
        self
    }

    fn u16(&self, v: u16) -> [u8; 2] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }
    fn u32(&self, v: u32) -> [u8; 4] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }
    fn u64(&self, v: u64) -> [u8; 8] {
        if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    }

    pub fn build(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(b"\x17\x08\x44tracing6\0");
        f.push(self.big as u8);
        f.push(8);
        f.extend_from_slice(&self.u32(self.page_size as u32));
        let header_page = format!(
            "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\
             \tfield: local_t commit;\toffset:8;\tsize:{l};\tsigned:1;\n\
             \tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\
             \tfield: char data;\toffset:{d};\tsize:{s};\tsigned:0;\n",
            l = self.long,
            d = 8 + self.long,
            s = self.page_size - 8 - self.long
        );
        f.extend_from_slice(b"header_page\0");
        f.extend_from_slice(&self.u64(header_page.len() as u64));
        f.extend_from_slice(header_page.as_bytes());
        let header_event = "# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n\tarray       :   32 bits\n\n\tpadding     : type == 29\n\ttime_extend : type == 30\n\ttime_stamp : type == 31\n\tdata max type_len  == 28\n";
        f.extend_from_slice(b"header_event\0");
        f.extend_from_slice(&self.u64(header_event.len() as u64));
        f.extend_from_slice(header_event.as_bytes());
        let ftrace: Vec<&String> = self
            .formats
            .iter()
            .filter(|(s, _)| s == "ftrace")
            .map(|(_, t)| t)
            .collect();
        f.extend_from_slice(&self.u32(ftrace.len() as u32));
        for t in ftrace {
            f.extend_from_slice(&self.u64(t.len() as u64));
            f.extend_from_slice(t.as_bytes());
        }
        let mut systems: Vec<&str> = Vec::new();
        for (s, _) in &self.formats {
            if s != "ftrace" && !systems.contains(&s.as_str()) {
                systems.push(s);
            }
        }
        f.extend_from_slice(&self.u32(systems.len() as u32));
        for s in systems {
            f.extend_from_slice(s.as_bytes());
            f.push(0);
            let texts: Vec<&String> = self
                .formats
                .iter()
                .filter(|(x, _)| x == s)
                .map(|(_, t)| t)
                .collect();
            f.extend_from_slice(&self.u32(texts.len() as u32));
            for t in texts {
                f.extend_from_slice(&self.u64(t.len() as u64));
                f.extend_from_slice(t.as_bytes());
            }
        }
        f.extend_from_slice(&self.u32(0)); // kallsyms
        f.extend_from_slice(&self.u32(self.printk.len() as u32));
        f.extend_from_slice(self.printk.as_bytes());
        f.extend_from_slice(&self.u64(self.cmdlines.len() as u64));
        f.extend_from_slice(self.cmdlines.as_bytes());
        let ncpu = self.cpus.len();
        f.extend_from_slice(&self.u32(ncpu as u32));

        let mut buffer_fixups = Vec::new();
        if !self.options.is_empty() || self.clock.is_some() || !self.instances.is_empty() {
            f.extend_from_slice(b"options  \0");
            for (id, data) in &self.options {
                f.extend_from_slice(&self.u16(*id));
                f.extend_from_slice(&self.u32(data.len() as u32));
                f.extend_from_slice(data);
            }
            if self.clock.is_some() {
                f.extend_from_slice(&self.u16(4));
                f.extend_from_slice(&self.u32(0));
            }
            for (name, _) in &self.instances {
                f.extend_from_slice(&self.u16(3));
                f.extend_from_slice(&self.u32(8 + name.len() as u32 + 1));
                buffer_fixups.push(f.len());
                f.extend_from_slice(&[0; 8]);
                f.extend_from_slice(name.as_bytes());
                f.push(0);
            }
            f.extend_from_slice(&self.u16(0));
        }
        f.extend_from_slice(b"flyrecord\0");
        let top = self.write_buffer_table(&mut f);
        let mut tables = vec![(top, &self.cpus)];
        for (i, (_, cpus)) in self.instances.iter().enumerate() {
            let at = f.len() as u64;
            let fix = buffer_fixups[i];
            f[fix..fix + 8].copy_from_slice(&self.u64(at));
            f.extend_from_slice(b"flyrecord\0");
            let table = self.write_buffer_table(&mut f);
            tables.push((table, cpus));
        }
        for (table, cpus) in tables {
            for (cpu, pages) in cpus.iter().enumerate() {
                while f.len() % self.page_size != 0 {
                    f.push(0);
                }
                let start = f.len() as u64;
                for p in pages {
                    f.extend_from_slice(&p.bytes(self.page_size, self.long));
                }
                let size = f.len() as u64 - start;
                let at = table + cpu * 16;
                f[at..at + 8].copy_from_slice(&self.u64(start));
                f[at + 8..at + 16].copy_from_slice(&self.u64(size));
            }
        }
        f
    }

    /// Writes a zeroed CPU table (and the clock) and returns where it is.
    fn write_buffer_table(&self, f: &mut Vec<u8>) -> usize {
        let at = f.len();
        f.resize(f.len() + 16 * self.cpus.len(), 0);
        if let Some(clock) = &self.clock {
            let text = format!("[{clock}] global\n");
            f.extend_from_slice(&self.u64(text.len() as u64));
            f.extend_from_slice(text.as_bytes());
        }
        at
    }
}

/// Compression of a built v7 file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Zlib,
    Zstd,
}

impl Compression {
    fn name(self) -> (&'static str, &'static str) {
        match self {
            Compression::None => ("none", ""),
            Compression::Zlib => ("zlib", "1.2.13"),
            Compression::Zstd => ("zstd", "1.5.4"),
        }
    }

    fn compress(self, data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        match self {
            Compression::None => data.to_vec(),
            Compression::Zstd => zstd::bulk::compress(data, 3).unwrap(),
            Compression::Zlib => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
        }
    }
}

impl Builder {
    fn header_info(&self) -> Vec<u8> {
        // The v6 layout of these parts is the v7 section content.
        let v6 = self.build();
        let start = 10 + 2 + 1 + 1 + 4;
        let kallsyms = {
            // header_page, header_event, ftrace formats and event formats
            // run up to the kallsyms size word.
            let mut pos = start;
            let read8 = |p: usize| {
                let b: [u8; 8] = v6[p..p + 8].try_into().unwrap();
                if self.big {
                    u64::from_be_bytes(b)
                } else {
                    u64::from_le_bytes(b)
                }
            };
            pos += 12;
            pos += 8 + read8(pos) as usize;
            pos += 13;
            pos += 8 + read8(pos) as usize;
            pos
        };
        v6[start..kallsyms].to_vec()
    }

    /// The same trace as a version 7 file (one options section for the
    /// metadata, a second one for the buffer, as trace-cmd writes them).
    pub fn build_v7(&self, compression: Compression) -> Vec<u8> {
        assert!(self.instances.is_empty(), "instances are not built in v7");
        let v6 = self.build();
        let mut f = Vec::new();
        f.extend_from_slice(b"\x17\x08\x44tracing7\0");
        f.push(self.big as u8);
        f.push(8);
        f.extend_from_slice(&self.u32(self.page_size as u32));
        let (name, version) = compression.name();
        f.extend_from_slice(name.as_bytes());
        f.push(0);
        f.extend_from_slice(version.as_bytes());
        f.push(0);
        let first_options = f.len();
        f.extend_from_slice(&[0; 8]);

        // Metadata sections, cut out of the v6 layout.
        let header_info = self.header_info();
        let after_headers = 18 + header_info.len();
        let mut pos = after_headers;
        let r4 = |p: usize| {
            let b: [u8; 4] = v6[p..p + 4].try_into().unwrap();
            (if self.big {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }) as usize
        };
        let r8 = |p: usize| {
            let b: [u8; 8] = v6[p..p + 8].try_into().unwrap();
            (if self.big {
                u64::from_be_bytes(b)
            } else {
                u64::from_le_bytes(b)
            }) as usize
        };
        let ftrace_start = pos;
        let n = r4(pos);
        pos += 4;
        for _ in 0..n {
            pos += 8 + r8(pos);
        }
        let events_start = pos;
        let systems = r4(pos);
        pos += 4;
        for _ in 0..systems {
            pos = v6[pos..].iter().position(|&b| b == 0).unwrap() + pos + 1;
            let n = r4(pos);
            pos += 4;
            for _ in 0..n {
                pos += 8 + r8(pos);
            }
        }
        let kallsyms_start = pos;
        pos += 4 + r4(pos);
        let printk_start = pos;
        pos += 4 + r4(pos);
        let cmdlines_start = pos;
        pos += 8 + r8(pos);
        let parts = [
            (16u16, header_info),
            (17, v6[ftrace_start..events_start].to_vec()),
            (18, v6[events_start..kallsyms_start].to_vec()),
            (19, v6[kallsyms_start..printk_start].to_vec()),
            (20, v6[printk_start..cmdlines_start].to_vec()),
            (21, v6[cmdlines_start..pos].to_vec()),
        ];
        let mut offsets = Vec::new();
        for (id, content) in &parts {
            offsets.push((*id, f.len() as u64));
            self.section(&mut f, *id, content, compression);
        }

        // Options 1: where the metadata is, then DONE -> options 2.
        let mut opts = Vec::new();
        for (id, at) in &offsets {
            opts.extend_from_slice(&self.u16(*id));
            opts.extend_from_slice(&self.u32(8));
            opts.extend_from_slice(&self.u64(*at));
        }
        opts.extend_from_slice(&self.u16(8));
        opts.extend_from_slice(&self.u32(4));
        opts.extend_from_slice(&self.u32(self.cpus.len() as u32));
        opts.extend_from_slice(&self.u16(0));
        opts.extend_from_slice(&self.u32(8));
        let done_fixup = opts.len();
        opts.extend_from_slice(&[0; 8]);
        let options1 = f.len();
        let at = first_options;
        f[at..at + 8].copy_from_slice(&self.u64(options1 as u64));
        let options1_data = options1 + 16;
        self.section(&mut f, 0, &opts, Compression::None);

        // The buffer section: header, padding, per-CPU data.
        let buffer_at = f.len() as u64;
        let flags = if compression == Compression::None {
            0u16
        } else {
            1
        };
        f.extend_from_slice(&self.u16(3));
        f.extend_from_slice(&self.u16(flags));
        f.extend_from_slice(&self.u32(0));
        let size_at = f.len();
        f.extend_from_slice(&[0; 8]);
        let mut table = Vec::new();
        for (cpu, pages) in self.cpus.iter().enumerate() {
            while f.len() % self.page_size != 0 {
                f.push(0);
            }
            let start = f.len() as u64;
            let raw: Vec<u8> = pages
                .iter()
                .flat_map(|p| p.bytes(self.page_size, self.long))
                .collect();
            if compression == Compression::None {
                f.extend_from_slice(&raw);
            } else if !raw.is_empty() {
                // Two chunks when there are several pages, to test chunking.
                let split = (raw.len() / self.page_size / 2).max(1) * self.page_size;
                let chunks: Vec<&[u8]> = if split < raw.len() {
                    vec![&raw[..split], &raw[split..]]
                } else {
                    vec![&raw[..]]
                };
                f.extend_from_slice(&self.u32(chunks.len() as u32));
                for c in chunks {
                    let packed = compression.compress(c);
                    f.extend_from_slice(&self.u32(packed.len() as u32));
                    f.extend_from_slice(&self.u32(c.len() as u32));
                    f.extend_from_slice(&packed);
                }
            }
            table.push((cpu as u32, start, f.len() as u64 - start));
        }
        let size = f.len() as u64 - (size_at as u64 + 8);
        f[size_at..size_at + 8].copy_from_slice(&self.u64(size));

        // Options 2: the buffer.
        let options2 = f.len() as u64;
        let at = options1_data + done_fixup;
        f[at..at + 8].copy_from_slice(&self.u64(options2));
        let mut buf = Vec::new();
        buf.extend_from_slice(&self.u64(buffer_at));
        buf.push(0);
        buf.extend_from_slice(self.clock.as_deref().unwrap_or("local").as_bytes());
        buf.push(0);
        buf.extend_from_slice(&self.u32(self.page_size as u32));
        buf.extend_from_slice(&self.u32(table.len() as u32));
        for (cpu, off, size) in table {
            buf.extend_from_slice(&self.u32(cpu));
            buf.extend_from_slice(&self.u64(off));
            buf.extend_from_slice(&self.u64(size));
        }
        let mut opts = Vec::new();
        opts.extend_from_slice(&self.u16(3));
        opts.extend_from_slice(&self.u32(buf.len() as u32));
        opts.extend_from_slice(&buf);
        opts.extend_from_slice(&self.u16(0));
        opts.extend_from_slice(&self.u32(8));
        opts.extend_from_slice(&[0; 8]);
        self.section(&mut f, 0, &opts, Compression::None);
        f
    }

    fn section(&self, f: &mut Vec<u8>, id: u16, content: &[u8], compression: Compression) {
        let compressed = compression != Compression::None;
        f.extend_from_slice(&self.u16(id));
        f.extend_from_slice(&self.u16(compressed as u16));
        f.extend_from_slice(&self.u32(0));
        if compressed {
            let packed = compression.compress(content);
            f.extend_from_slice(&self.u64(8 + packed.len() as u64));
            f.extend_from_slice(&self.u32(packed.len() as u32));
            f.extend_from_slice(&self.u32(content.len() as u32));
            f.extend_from_slice(&packed);
        } else {
            f.extend_from_slice(&self.u64(content.len() as u64));
            f.extend_from_slice(content);
        }
    }
}
