//! A hand-built trace exercising what the corpus does not: LTTng ≥ 2.6
//! syscall names, compact-header timestamp wrap-around and the extended
//! escape, bit-packed and big-endian integers in a little-endian trace,
//! floats, a variant selected by an enumeration range, a sequence, nested
//! structs, a `tid` context, lost events, and a clock with offset_s. Decoded
//! by us and by babeltrace2 (the same bytes written to a folder).

#![allow(clippy::manual_is_multiple_of)] // MSRV 1.80

mod common;

use std::path::Path;

use common::*;
use deepspan_ctf::{CtfTrace, Error};
use deepspan_model::{EventKind, Value};

/// Shared with the fuzz target.
pub const METADATA: &str = include_str!("data/synthetic.tsdl");

/// Writes CTF bit fields (alignment relative to the packet start).
#[derive(Default)]
pub struct Bits {
    pub bytes: Vec<u8>,
    pub pos: u64,
}

impl Bits {
    pub fn new() -> Bits {
        Bits {
            bytes: Vec::new(),
            pos: 0,
        }
    }
    pub fn align(&mut self, a: u64) {
        self.pos = self.pos.div_ceil(a) * a;
        self.fit();
    }
    fn fit(&mut self) {
        let need = self.pos.div_ceil(8) as usize;
        if self.bytes.len() < need {
            self.bytes.resize(need, 0);
        }
    }
    pub fn int(&mut self, v: u64, size: u64, align: u64, be: bool) {
        self.align(align);
        for i in 0..size {
            let (bit, p) = if be {
                ((v >> (size - 1 - i)) & 1, self.pos + i)
            } else {
                ((v >> i) & 1, self.pos + i)
            };
            let byte = (p / 8) as usize;
            if self.bytes.len() <= byte {
                self.bytes.resize(byte + 1, 0);
            }
            let shift = if be { 7 - (p % 8) } else { p % 8 };
            self.bytes[byte] |= (bit as u8) << shift;
        }
        self.pos += size;
        self.fit();
    }
    pub fn le(&mut self, v: u64, size: u64) {
        self.int(v, size, if size % 8 == 0 { 8 } else { 1 }, false);
    }
    pub fn string(&mut self, s: &str) {
        self.align(8);
        for b in s.bytes().chain([0]) {
            self.le(b as u64, 8);
        }
    }
    pub fn set_u64(&mut self, at_bits: u64, v: u64) {
        let at = (at_bits / 8) as usize;
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

const UUID: [u8; 16] = [
    0x01, 0x23, 0xab, 0xcd, 0, 0, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55,
];

/// One packet: header + context, then `events` writes the events; sizes
/// are patched in afterwards. Returns the packet bytes.
pub fn packet(
    ts_begin: u64,
    ts_end: u64,
    discarded: u64,
    cpu: u32,
    events: impl FnOnce(&mut Bits),
) -> Vec<u8> {
    let mut b = Bits::default();
    b.le(0xC1FC1FC1, 32);
    for u in UUID {
        b.le(u as u64, 8);
    }
    b.le(0, 32); // stream_id
    b.le(ts_begin, 64);
    b.le(ts_end, 64);
    let sizes_at = b.pos;
    b.le(0, 64);
    b.le(0, 64);
    b.le(discarded, 64);
    b.le(cpu as u64, 32);
    events(&mut b);
    let content = b.pos;
    b.align(8);
    b.bytes.extend_from_slice(&[0; 5]); // padding after the content
    let size = b.bytes.len() as u64 * 8;
    b.set_u64(sizes_at, content);
    b.set_u64(sizes_at + 64, size);
    b.bytes
}

/// Compact header (id < 31, 27-bit timestamp) or extended.
fn header(b: &mut Bits, id: u64, ts: u64) {
    b.align(8);
    if id < 31 && ts < 1 << 27 {
        b.le(id, 5);
        b.le(ts, 27);
    } else {
        b.le(31, 5);
        b.int(id, 32, 8, false);
        b.int(ts, 64, 8, false);
    }
}

fn ctx(b: &mut Bits, tid: i32) {
    b.int(tid as u32 as u64, 32, 8, false);
}

pub fn streams() -> Vec<Vec<u8>> {
    let p1 = packet(500, (1 << 27) + 10, 0, 3, |b| {
        header(b, 0, 1000);
        ctx(b, 42);
        b.le(0x7f00_dead, 64);
        b.le(128, 32);
        b.le(1, 32);

        header(b, 40, 2000); // id 40 needs the extended header
        ctx(b, 42);
        b.align(64); // a struct is aligned on its most aligned member (f64)
        b.int(0b110, 3, 1, false); // -2
        b.int(0b10101, 5, 1, false);
        // Byte order changes only at byte boundaries (babeltrace2 refuses
        // anything else, the spec leaves it undefined).
        b.int(0x1abc, 13, 1, true);
        b.int(0b011, 3, 1, true);
        b.int(1.5f32.to_bits() as u64, 32, 32, false);
        b.int((-2.25f64).to_bits(), 64, 64, true);
        b.le(3, 8); // B (range 1 ... 5)
        b.string("hello");
        b.le(2, 8);
        b.le(7, 16);
        b.le(65535, 16);
        b.string("x");
        b.le(1, 8);
        b.le(2, 8);

        // The 27-bit timestamp wraps: 5 < 2000 means one wrap-around.
        header(b, 1, 5);
        ctx(b, 42);
        b.le((-11i64) as u64, 64);
        b.le(0x7f00_dead, 64);
    });
    let p2 = packet((1 << 27) + 20, (1 << 27) + 100, 4, 3, |b| {
        header(b, 40, (1 << 27) + 30); // extended again: full 64-bit timestamp
        ctx(b, 7);
        b.align(64);
        b.int(1, 3, 1, false);
        b.int(0, 5, 1, false);
        b.int(0, 13, 1, true);
        b.int(0b100, 3, 1, true); // -4
        b.int(0f32.to_bits() as u64, 32, 32, false);
        b.int(0f64.to_bits(), 64, 64, true);
        b.le(6, 8); // C (auto value 5 + 1)
        b.le(9, 8);
        b.le(10, 8);
        b.le(0, 8); // empty sequence
        b.string("");
        b.le(3, 8);
        b.le(4, 8);
    });
    vec![[p1, p2].concat()]
}

#[test]
fn synthetic_trace_decodes_as_built() {
    let t = CtfTrace::from_memory(METADATA.as_bytes(), streams()).unwrap();
    let info = &t.traces()[0];
    assert_eq!(info.hostname(), Some("synth"));
    assert_eq!(info.clock_offset_ns(), 10_000_000_005);
    assert!(!info.tid_inferred());
    let mut it = t.events();
    let ev: Vec<_> = it.by_ref().map(|e| e.unwrap()).collect();
    assert_eq!(it.lost_events(), 4);
    let ts: Vec<u64> = ev.iter().map(|e| e.monotonic_ns()).collect();
    assert_eq!(ts, [1000, 2000, (1 << 27) + 5, (1 << 27) + 30]);
    assert!(ev
        .iter()
        .all(|e| e.ts() == e.monotonic_ns() + 10_000_000_005));
    assert!(ev.iter().all(|e| e.cpu() == 3));

    let enter = ev[0].to_event();
    assert_eq!(enter.tid, 42);
    assert_eq!(
        enter.kind,
        EventKind::SysEnter {
            id: -1,
            name: Some("futex".into()),
            args: [0x7f00_dead, 128, 1, 0, 0, 0]
        }
    );
    assert_eq!(
        ev[2].to_event().kind,
        EventKind::SysExit {
            id: -1,
            name: Some("futex".into()),
            ret: -11
        }
    );

    let misc = &ev[1];
    assert_eq!(misc.loglevel(), Some(13));
    assert_eq!(misc.enum_label("sel"), Some("B"));
    let names: Vec<&str> = misc.fields().iter().map(|(n, _)| &**n).collect();
    assert_eq!(
        names,
        [
            "bits3",
            "pad5",
            "be13",
            "be3",
            "f32",
            "f64",
            "sel",
            "var",
            "n",
            "seq",
            "s",
            "nested.a",
            "nested.inner.b"
        ]
    );
    let vals: Vec<&Value> = misc.fields().iter().map(|(_, v)| v).collect();
    assert_eq!(
        vals,
        [
            &Value::Int(-2),
            &Value::UInt(0b10101),
            &Value::UInt(0x1abc),
            &Value::Int(3),
            &Value::Float(1.5),
            &Value::Float(-2.25),
            &Value::UInt(3),
            &Value::Str("hello".into()),
            &Value::UInt(2),
            &Value::Array(vec![Value::UInt(7), Value::UInt(65535)]),
            &Value::Str("x".into()),
            &Value::UInt(1),
            &Value::UInt(2),
        ]
    );
    assert_eq!(misc.context_field("tid"), Some(&Value::Int(42)));
    assert_eq!(ev[3].enum_label("sel"), Some("C"));
    assert_eq!(ev[3].field("var.x"), Some(&Value::UInt(9)));
    assert_eq!(ev[3].field("var.y"), Some(&Value::UInt(10)));
    assert_eq!(ev[3].field("seq"), Some(&Value::Array(vec![])));
    assert_eq!(ev[3].tid(), 7);
    assert_eq!(ev[3].field("be3"), Some(&Value::Int(-4)));
}

#[test]
fn synthetic_trace_matches_babeltrace2() {
    if !tool_available("babeltrace2") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    if let Ok(keep) = std::env::var("DEEPSPAN_KEEP_SYNTHETIC") {
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(Path::new(&keep).join("metadata"), METADATA).unwrap();
        std::fs::write(Path::new(&keep).join("chan_0"), &streams()[0]).unwrap();
    }
    std::fs::write(dir.path().join("metadata"), METADATA).unwrap();
    std::fs::write(dir.path().join("chan_0"), &streams()[0]).unwrap();
    let t = CtfTrace::open(dir.path()).unwrap();
    let ours: Vec<BtEvent> = t.events().map(|e| our_event(&e.unwrap())).collect();
    assert_same_events(&ours, &babeltrace_events(dir.path()), "synthetic");
}

#[test]
fn cut_packets_are_reported_not_errors() {
    let mut s = streams();
    // Cut the second packet in the middle.
    let len = s[0].len();
    s[0].truncate(len - 20);
    let t = CtfTrace::from_memory(METADATA.as_bytes(), s).unwrap();
    let results: Vec<_> = t.events().collect();
    assert!(results.iter().all(|r| r.is_ok()), "no error");
    assert_eq!(results.len(), 3, "events before the damage are kept");
    let cuts = t.truncations();
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    assert_eq!(cuts[0].path.to_str(), Some("stream0"));
    assert_eq!(cuts[0].file_bytes, len as u64 - 20);
    assert_eq!(cuts[0].missing_bytes(), Some(20));
    assert!(cuts[0].packet_offset > 0 && cuts[0].packet_offset < len as u64);
}

/// Writes the fuzz seeds of fuzz/fuzz_targets/ctf.rs (input layout
/// described there). Run with `cargo test -p deepspan-ctf --test synthetic
/// -- --ignored write_ctf_fuzz_seeds`.
#[test]
#[ignore]
fn write_ctf_fuzz_seeds() {
    let out = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/ctf_seeds"));
    std::fs::create_dir_all(out).unwrap();
    let fixed = [
        ("rotation", "lttng-tracefile-rotation/kernel", 12),
        ("flipping", "flipping-endianness/trace", 12),
        ("bug446190", "bug446190/trace", 12),
        ("perf", "perf-taskset2/trace", 6),
        ("multi-domains", "multi-domains/kernel", 2),
    ];
    for (i, (name, dir, n)) in fixed.iter().enumerate() {
        let (_, stream) = small_trace(&corpus(dir), *n);
        std::fs::write(
            out.join(format!("{name}.bin")),
            [&[1 + i as u8][..], &stream].concat(),
        )
        .unwrap();
    }
    let synth = &streams()[0];
    std::fs::write(out.join("synthetic.bin"), [&[6u8][..], synth].concat()).unwrap();
    let text_mode = |meta: &[u8], stream: &[u8]| [&[0u8][..], meta, &[0u8], stream].concat();
    std::fs::write(
        out.join("synthetic-text.bin"),
        text_mode(METADATA.as_bytes(), synth),
    )
    .unwrap();
    let (perf_meta, perf_stream) = small_trace(&corpus("perf-taskset2/trace"), 4);
    std::fs::write(
        out.join("perf-text.bin"),
        text_mode(&perf_meta, &perf_stream),
    )
    .unwrap();
}

#[test]
fn reader_types_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<CtfTrace>();
    send_sync::<deepspan_ctf::CtfEvent>();
    send::<deepspan_ctf::Events>();
    send_sync::<Error>();
}
