//! The hand-built CTF trace of `synthetic.rs` (metadata in
//! tests/data/synthetic.tsdl, packets written bit by bit), shared with the
//! `write_ctf_fuzz_seeds` example.

#![allow(clippy::manual_is_multiple_of)] // MSRV 1.80

/// Shared with the fuzz target (fuzz/fuzz_targets/ctf.rs).
pub const METADATA: &str = include_str!("../../data/synthetic.tsdl");

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
