//! Parquet's RLE / bit-packing hybrid encoding, for dictionary indices and
//! definition levels (the parquet crate keeps its encoder private).
//!
//! The stream is a sequence of runs, each led by a ULEB128 header: an RLE
//! run (`count << 1`, then the value in `ceil(width / 8)` little-endian
//! bytes) or a bit-packed run (`groups << 1 | 1`, then `groups * 8` values
//! of `width` bits each, least significant bit first). Runs of at least
//! [`MIN_REPEAT`] equal values become RLE runs; the values between them are
//! bit-packed, in groups of 8, the last group padded with zeros (a reader
//! knows the true count from the page).

/// The shortest repetition written as an RLE run: one bit-packed group.
const MIN_REPEAT: usize = 8;

/// The most groups in one bit-packed run. Any ULEB128 count is valid, but
/// common writers keep literal runs to 64 groups and some readers size
/// buffers by it.
const MAX_GROUPS: usize = 64;

/// The bits needed for values up to `max`.
pub fn bit_width(max: u32) -> u8 {
    (32 - max.leading_zeros()) as u8
}

/// What can be encoded: dictionary indices, and definition levels as the
/// crate's column writer takes them (no conversion pass).
pub trait Value: Copy + PartialEq {
    fn bits(self) -> u32;
}

impl Value for u32 {
    #[inline(always)]
    fn bits(self) -> u32 {
        self
    }
}

impl Value for i16 {
    #[inline(always)]
    fn bits(self) -> u32 {
        self as u16 as u32
    }
}

/// Appends `values` (each below `1 << width`) to `out`.
pub fn encode<T: Value>(values: &[T], width: u8, out: &mut Vec<u8>) {
    debug_assert!(width <= 32);
    let mut literal_start = 0;
    let mut i = 0;
    while i < values.len() {
        let v = values[i];
        // Most positions start no run: one look at where a run's last
        // value would be tells.
        if values.get(i + MIN_REPEAT - 1) != Some(&v) {
            i += 1;
            continue;
        }
        let run = values[i..].iter().take_while(|&&x| x == v).count();
        if run < MIN_REPEAT {
            i += run;
            continue;
        }
        // Literals before the run must fill whole groups: the run lends
        // them its first values (it keeps at least one).
        let pending = i - literal_start;
        let lend = (MIN_REPEAT - pending % MIN_REPEAT) % MIN_REPEAT;
        bit_packed(&values[literal_start..i + lend], width, out);
        rle_run(v, run - lend, width, out);
        i += run;
        literal_start = i;
    }
    bit_packed(&values[literal_start..], width, out);
}

fn rle_run<T: Value>(value: T, count: usize, width: u8, out: &mut Vec<u8>) {
    uleb128((count as u64) << 1, out);
    let bytes = usize::from(width).div_ceil(8);
    out.extend_from_slice(&value.bits().to_le_bytes()[..bytes]);
}

/// Writes `values` as bit-packed runs (the last group zero-padded).
fn bit_packed<T: Value>(values: &[T], width: u8, out: &mut Vec<u8>) {
    for chunk in values.chunks(MAX_GROUPS * 8) {
        let groups = chunk.len().div_ceil(8);
        uleb128(((groups as u64) << 1) | 1, out);
        let full = chunk.chunks_exact(8);
        let rest = full.remainder();
        for group in full {
            pack_group(group, width, out);
        }
        if !rest.is_empty() {
            let mut group = [0u32; 8];
            for (g, &v) in group.iter_mut().zip(rest) {
                *g = v.bits();
            }
            pack_group(&group, width, out);
        }
    }
}

/// Packs 8 values of `width` bits: `width` bytes.
#[inline]
fn pack_group<T: Value>(group: &[T], width: u8, out: &mut Vec<u8>) {
    let w = u32::from(width);
    if w <= 8 {
        // Most dictionaries (up to 256 values) and all levels: the 8 values
        // fit in one word.
        let mut acc: u64 = 0;
        for (k, &v) in group.iter().enumerate() {
            acc |= u64::from(v.bits()) << (k as u32 * w);
        }
        out.extend_from_slice(&acc.to_le_bytes()[..w as usize]);
        return;
    }
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &v in group {
        acc |= u64::from(v.bits()) << bits;
        bits += w;
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
    // 8 values of any width fill whole bytes.
    debug_assert_eq!(bits, 0);
}

/// Appends `v` as ULEB128 (also the varint of DELTA_BINARY_PACKED).
pub(crate) fn uleb128(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader written from the format description, independent of the
    /// encoder's choices.
    fn decode(mut bytes: &[u8], width: u8, count: usize) -> Vec<u32> {
        let mut out = Vec::new();
        while out.len() < count {
            let mut header = 0u64;
            let mut shift = 0;
            loop {
                let b = bytes[0];
                bytes = &bytes[1..];
                header |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b & 0x80 == 0 {
                    break;
                }
            }
            if header & 1 == 0 {
                let n = usize::from(width).div_ceil(8);
                let mut v = [0u8; 4];
                v[..n].copy_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                out.extend(std::iter::repeat_n(
                    u32::from_le_bytes(v),
                    (header >> 1) as usize,
                ));
            } else {
                let values = (header >> 1) as usize * 8;
                let len = values * usize::from(width) / 8;
                let (packed, rest) = bytes.split_at(len);
                bytes = rest;
                for k in 0..values {
                    let mut v = 0u32;
                    for b in 0..usize::from(width) {
                        let bit = k * usize::from(width) + b;
                        v |= u32::from(packed[bit / 8] >> (bit % 8) & 1) << b;
                    }
                    out.push(v);
                }
            }
        }
        assert!(bytes.is_empty(), "{} bytes after the last run", bytes.len());
        out.truncate(count);
        out
    }

    fn round_trip(values: &[u32]) -> Vec<u8> {
        let width = bit_width(values.iter().copied().max().unwrap_or(0));
        let mut out = Vec::new();
        encode(values, width, &mut out);
        assert_eq!(decode(&out, width, values.len()), values, "width {width}");
        out
    }

    #[test]
    fn widths() {
        assert_eq!(bit_width(0), 0);
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(2), 2);
        assert_eq!(bit_width(255), 8);
        assert_eq!(bit_width(256), 9);
        assert_eq!(bit_width(u32::MAX), 32);
    }

    #[test]
    fn long_repeats_are_one_run() {
        let out = round_trip(&[5; 100_000]);
        // Header (3 bytes of ULEB128) and one byte of value.
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn width_zero_is_headers_only() {
        assert_eq!(round_trip(&[0; 20]), vec![40]);
        assert_eq!(round_trip(&[0; 3]), vec![3]);
    }

    #[test]
    fn literals_then_run_then_literals() {
        let mut v: Vec<u32> = (0..13).collect();
        v.extend([7; 30]);
        v.extend([1, 2, 3]);
        round_trip(&v);
    }

    #[test]
    fn short_repeats_stay_literal() {
        let v: Vec<u32> = (0..1000).map(|i| i / 7).collect();
        round_trip(&v);
    }

    #[test]
    fn long_literal_stretches_split() {
        let v: Vec<u32> = (0..5000u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 20)
            .collect();
        round_trip(&v);
        let wide: Vec<u32> = (0..700u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        round_trip(&wide);
    }

    #[test]
    fn every_mix_of_short_inputs() {
        // All sequences over {0, 1, 2} of length 0..=9 with runs spliced in.
        for len in 0..=9u32 {
            for code in 0..3u32.pow(len) {
                let mut v = Vec::new();
                let mut c = code;
                for _ in 0..len {
                    let x = c % 3;
                    c /= 3;
                    // Every third symbol repeats long enough to be a run.
                    v.extend(std::iter::repeat_n(x, if x == 2 { 9 } else { 1 }));
                }
                round_trip(&v);
            }
        }
    }
}
