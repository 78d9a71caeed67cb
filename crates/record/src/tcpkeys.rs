//! `record --tcp-keys`: every TCP segment leaving or entering a device,
//! with the header fields that are the same at both ends (seq, ack_seq,
//! flags), so that `deepspan sync` can match a segment one host sent with
//! the one another host received and put their kernel clocks on one line
//! (the convex-hull sync of Ezzati-Jivan et al. 2021, §3.1, after
//! Jabbarifar et al. 2015, needs such one-way messages; span pairs alone
//! bound a clock only to tens of µs).
//!
//! The upstream `net`/`tcp` tracepoints carry no sequence numbers, so an
//! eBPF program (`bpf/tcp_keys.bpf.c`, compiled by build.rs, loaded with
//! aya) reads the TCP header through the tracepoints' skb pointer and puts
//! each segment in a ring buffer that a thread of the recorder drains
//! ([`crate::bpf`]). Its clock, `bpf_ktime_get_ns`, is CLOCK_MONOTONIC, the
//! trace's.
//!
//! Written to `RUN/kernel/tcp_segments.tsv`, one segment a line (see
//! [`TcpSegment`]); a run limited to processes (`--pid`) keeps the segments
//! of their network namespaces only, so that two namespaces of one machine
//! recorded as two hosts each hold their own side of the traffic.

use std::fs::File;
use std::path::Path;

use crate::capture_file::{self, CaptureLine, Fields, FileCapture, FileSink, Written};
use crate::Error;
use deepspan_run::{layout::TCP_SEGMENTS, TcpKeysManifest};

/// The file's first line; the columns of every other line.
const HEADER: &str =
    "# deepspan tcp segments v1: dir mono_ns cpu tid netns seq ack_seq flags len sport dport";

/// The namespaces the program's own filter holds (its `NETNS` map); more
/// are left to the writer's filter.
const PROGRAM_NETNS: usize = 4;

/// A segment record of the program's ring buffer.
const RECORD_BYTES: usize = 48;

/// One TCP segment at a device: sent (`net_dev_queue`) or received
/// (`netif_receive_skb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSegment {
    pub sent: bool,
    /// CLOCK_MONOTONIC ns.
    pub mono_ns: u64,
    pub cpu: u32,
    /// The thread current on that CPU (the sender for most sends; any
    /// thread, or none (0), in a softirq).
    pub tid: i32,
    /// The inode of the device's network namespace.
    pub netns: u64,
    pub seq: u32,
    pub ack_seq: u32,
    /// TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10).
    pub flags: u8,
    /// The skb's length (headers included; differs between the ends).
    pub len: u32,
    pub sport: u16,
    pub dport: u16,
}

impl TcpSegment {
    /// Parses one line of the segments file.
    pub fn parse(line: &str) -> Result<TcpSegment, String> {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.len() != 11 {
            return Err(format!("{} fields, expected 11 ({HEADER})", fields.len()));
        }
        let sent = match fields[0] {
            "S" => true,
            "R" => false,
            other => return Err(format!("direction {other:?}, expected S or R")),
        };
        fn num<T: std::str::FromStr>(what: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{what} {text:?} is not a number in range"))
        }
        Ok(TcpSegment {
            sent,
            mono_ns: num("time", fields[1])?,
            cpu: num("cpu", fields[2])?,
            tid: num("tid", fields[3])?,
            netns: num("netns", fields[4])?,
            seq: num("seq", fields[5])?,
            ack_seq: num("ack_seq", fields[6])?,
            flags: num("flags", fields[7])?,
            len: num("len", fields[8])?,
            sport: num("sport", fields[9])?,
            dport: num("dport", fields[10])?,
        })
    }

    /// Appends the line (without its newline) to `out`, with no
    /// allocation: the capture's thread writes thousands a second.
    pub fn write_line(&self, out: &mut String) {
        Fields::new(out)
            .text(if self.sent { "S" } else { "R" })
            .num(self.mono_ns)
            .num(self.cpu)
            .num(self.tid)
            .num(self.netns)
            .num(self.seq)
            .num(self.ack_seq)
            .num(self.flags)
            .num(self.len)
            .num(self.sport)
            .num(self.dport);
    }
}

/// The line, written without an allocation.
impl CaptureLine for TcpSegment {
    const HEADER: &'static str = HEADER;

    fn write_line(&self, out: &mut String) {
        Self::write_line(self, out)
    }
    const WHAT: &'static str = "TCP segments";

    fn from_record(record: &[u8]) -> Option<TcpSegment> {
        TcpSegment::from_record(record)
    }

    fn from_line(line: &str) -> Result<TcpSegment, String> {
        TcpSegment::parse(line)
    }

    fn mono_ns(&self) -> u64 {
        self.mono_ns
    }
}

/// Reads a run's segments file: every segment, in file order. A last line
/// without its newline is what a killed recorder left mid-write: it is
/// left out.
pub fn read_tcp_segments(path: &Path) -> Result<Vec<TcpSegment>, Error> {
    capture_file::read_file(path)
}

/// The running capture: the attached program and the thread writing its
/// segments.
pub(crate) struct TcpKeyCapture {
    capture: FileCapture,
    /// The namespaces kept; empty: all.
    netns: Vec<u64>,
}

impl TcpKeyCapture {
    /// Loads and attaches the program; once this returns, every segment of
    /// the namespaces `netns` (empty: all) is captured.
    pub(crate) fn start(run: &Path, netns: Vec<u64>) -> Result<TcpKeyCapture, Error> {
        let path = run.join(TCP_SEGMENTS);
        let ring = program::attach(&netns).map_err(|e| {
            Error::InvalidOptions(format!(
                "--tcp-keys: {e} (root and a kernel with BPF and BTF are needed)"
            ))
        })?;
        let file =
            File::create(&path).map_err(|source| Error::output("create", &path, run, source))?;
        let sink = segment_sink(file, &netns).map_err(|e| Error::Io {
            action: "write",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        let capture = FileCapture::start("deepspan-tcpkeys", ring, sink, &path)?;
        Ok(TcpKeyCapture { capture, netns })
    }

    /// Detaches the program (once the ring is drained) and returns what
    /// was written.
    pub(crate) fn stop(self) -> Result<TcpKeysManifest, String> {
        let written = self.capture.stop()?;
        Ok(manifest(written, self.netns))
    }
}

/// The segments file being written into `file`: the segments of the
/// namespaces `netns` (empty: all), the others counted.
fn segment_sink(file: File, netns: &[u64]) -> Result<FileSink<TcpSegment>, String> {
    let sink = FileSink::from_file(file)?;
    Ok(match netns {
        [] => sink,
        kept => {
            let kept = kept.to_vec();
            sink.filtered(Box::new(move |s: &TcpSegment| kept.contains(&s.netns)))
        }
    })
}

/// The manifest's section for what was written.
fn manifest(written: Written, netns: Vec<u64>) -> TcpKeysManifest {
    TcpKeysManifest {
        file: TCP_SEGMENTS.into(),
        segments: written.records,
        other_netns: written.filtered,
        lost: written.lost,
        netns,
    }
}

impl TcpSegment {
    /// A record of the program's ring buffer (`struct segment` of
    /// `bpf/tcp_keys.bpf.c`), or None when it is not one.
    fn from_record(b: &[u8]) -> Option<TcpSegment> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u64_at = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u16_at = |at: usize| u16::from_ne_bytes(b[at..at + 2].try_into().expect("2 bytes"));
        Some(TcpSegment {
            sent: b[41] != 0,
            mono_ns: u64_at(0),
            cpu: u32_at(16),
            tid: u32_at(20) as i32,
            netns: u64_at(8),
            seq: u32_at(24),
            ack_seq: u32_at(28),
            flags: b[40],
            len: u32_at(32),
            sport: u16_at(36),
            dport: u16_at(38),
        })
    }
}

/// The eBPF program, when this build has it (build.rs compiles it with
/// clang when clang is there).
#[cfg(deepspan_bpf)]
mod program {
    use aya::maps::Array;
    use aya::programs::TracePoint;

    use super::PROGRAM_NETNS;
    use crate::bpf::Ring;

    /// The ELF reader needs the object aligned, which include_bytes! is not.
    static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tcp_keys.bpf.o"));

    pub(super) fn attach(netns: &[u64]) -> Result<Ring, String> {
        crate::bpf::load(
            OBJECT,
            "the eBPF program that reads TCP headers",
            "SEGMENTS",
            |ebpf| {
                if netns.len() <= PROGRAM_NETNS {
                    let map = ebpf.map_mut("NETNS").ok_or("no NETNS map")?;
                    let mut kept: Array<_, u64> = Array::try_from(map)
                        .map_err(|e| format!("cannot open the NETNS map: {e}"))?;
                    for (i, &ns) in netns.iter().enumerate() {
                        kept.set(i as u32, ns, 0)
                            .map_err(|e| format!("cannot configure the program: {e}"))?;
                    }
                }
                for name in ["net_dev_queue", "netif_receive_skb"] {
                    let program: &mut TracePoint = ebpf
                        .program_mut(name)
                        .ok_or_else(|| format!("no program {name}"))?
                        .try_into()
                        .map_err(|e| format!("{name}: {e}"))?;
                    program
                        .load()
                        .map_err(|e| format!("cannot verify {name}: {e}"))?;
                    program
                        .attach("net", name)
                        .map_err(|e| format!("cannot attach {name}: {e}"))?;
                }
                Ok(())
            },
        )
    }
}

/// This build has no eBPF program: `--tcp-keys` says why.
#[cfg(not(deepspan_bpf))]
mod program {
    pub(super) fn attach(_netns: &[u64]) -> Result<crate::bpf::Ring, String> {
        Err(crate::bpf::not_built("--tcp-keys"))
    }
}

/// The network namespace (inode) of process `pid`.
pub(crate) fn netns_of(pid: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let text = link.to_string_lossy();
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::RecordSink;

    #[test]
    fn a_segment_line_reads_back() {
        let line = "S 457084414274 0 8193 4026531833 878362228 0 2 74 53828 59095";
        let s = TcpSegment::parse(line).unwrap();
        assert!(s.sent);
        assert_eq!(
            (s.mono_ns, s.cpu, s.tid, s.netns),
            (457084414274, 0, 8193, 4026531833)
        );
        assert_eq!(
            (s.seq, s.ack_seq, s.flags, s.len, s.sport, s.dport),
            (878362228, 0, 2, 74, 53828, 59095)
        );
        assert_eq!(s.line(), line);
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(TcpSegment::parse("X 1 0 0 0 0 0 0 0 0 0")
            .unwrap_err()
            .contains("direction"));
        assert!(TcpSegment::parse("S 1 0 0 0")
            .unwrap_err()
            .contains("5 fields"));
        assert!(TcpSegment::parse("R 1 0 0 0 4294967296 0 0 0 0 0")
            .unwrap_err()
            .contains("seq"));
    }

    #[test]
    fn a_ring_record_reads_as_the_program_wrote_it() {
        let mut record = [0u8; RECORD_BYTES];
        record[0..8].copy_from_slice(&457084414274u64.to_ne_bytes());
        record[8..16].copy_from_slice(&4026531833u64.to_ne_bytes());
        record[16..20].copy_from_slice(&1u32.to_ne_bytes());
        record[20..24].copy_from_slice(&8193i32.to_ne_bytes());
        record[24..28].copy_from_slice(&878362228u32.to_ne_bytes());
        record[28..32].copy_from_slice(&7u32.to_ne_bytes());
        record[32..36].copy_from_slice(&74u32.to_ne_bytes());
        record[36..38].copy_from_slice(&53828u16.to_ne_bytes());
        record[38..40].copy_from_slice(&59095u16.to_ne_bytes());
        record[40] = 0x12;
        record[41] = 1;
        let s = TcpSegment::from_record(&record).unwrap();
        assert_eq!(
            s.line(),
            "S 457084414274 1 8193 4026531833 878362228 7 18 74 53828 59095"
        );
        assert_eq!(TcpSegment::from_record(&record[..40]), None);
    }

    #[test]
    fn the_sink_keeps_the_namespaces_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segments.tsv");
        let mut sink = segment_sink(File::create(&path).unwrap(), &[8]).unwrap();
        let kept = TcpSegment::parse("R 3 1 0 8 10 11 24 60 80 81").unwrap();
        sink.push_line(&kept).unwrap();
        sink.push_line(&TcpSegment { netns: 9, ..kept }).unwrap();
        let m = manifest(sink.finish(3).unwrap(), vec![8]);
        assert_eq!((m.segments, m.other_netns, m.lost), (1, 1, 3));
        assert_eq!(m.netns, vec![8]);
        assert_eq!(read_tcp_segments(&path).unwrap(), vec![kept]);
        // Without namespaces, every segment is kept.
        let mut sink = segment_sink(File::create(&path).unwrap(), &[]).unwrap();
        sink.push_line(&TcpSegment { netns: 9, ..kept }).unwrap();
        let m = manifest(sink.finish(0).unwrap(), vec![]);
        assert_eq!((m.segments, m.other_netns), (1, 0));
    }
}
