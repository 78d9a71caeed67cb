//! Parquet's DELTA_BINARY_PACKED encoding of 64-bit integers, for time and
//! duration columns: encoded here so that their chunks skip the parquet
//! crate's column writer and its work around each value (see `chunk.rs`).
//!
//! A header (block size, miniblocks per block, value count, first value),
//! then blocks of [`BLOCK`] deltas: the block's smallest delta, one bit
//! width per miniblock, and each miniblock's deltas minus that smallest,
//! bit-packed at its width (least significant bit first). Block and
//! miniblock sizes are those of the parquet crate and of Arrow C++.

use crate::rle::uleb128;

/// Deltas per block.
const BLOCK: usize = 128;
/// Miniblocks per block.
const MINIBLOCKS: usize = 4;
const MINIBLOCK: usize = BLOCK / MINIBLOCKS;

/// Appends `values`, encoded, to `out`.
pub fn encode(values: &[i64], out: &mut Vec<u8>) {
    uleb128(BLOCK as u64, out);
    uleb128(MINIBLOCKS as u64, out);
    uleb128(values.len() as u64, out);
    let Some((&first, rest)) = values.split_first() else {
        uleb128(zigzag(0), out);
        return;
    };
    uleb128(zigzag(first), out);
    let mut previous = first;
    let mut deltas = [0i64; BLOCK];
    for block in rest.chunks(BLOCK) {
        // Separate passes without a carried dependency: they vectorise.
        let deltas = &mut deltas[..block.len()];
        deltas[0] = block[0].wrapping_sub(previous);
        for ((d, &v), &before) in deltas[1..].iter_mut().zip(&block[1..]).zip(block) {
            *d = v.wrapping_sub(before);
        }
        previous = block[block.len() - 1];
        // A plain compare and select: `Iterator::min` went through `Ord`
        // and cost three times as much.
        let mut min = i64::MAX;
        for &d in deltas.iter() {
            min = if d < min { d } else { min };
        }
        let deltas = &*deltas;
        uleb128(zigzag(min), out);
        let widths_at = out.len();
        out.extend_from_slice(&[0; MINIBLOCKS]);
        for (m, mini) in deltas.chunks(MINIBLOCK).enumerate() {
            let mut packed = [0u64; MINIBLOCK];
            let mut any = 0u64;
            for (p, &d) in packed.iter_mut().zip(mini) {
                *p = d.wrapping_sub(min) as u64;
                any |= *p;
            }
            let width = 64 - any.leading_zeros();
            out[widths_at + m] = width as u8;
            pack(&packed, width, out);
        }
    }
}

/// Packs 32 values of `width` bits (`4 * width` bytes).
fn pack(values: &[u64; MINIBLOCK], width: u32, out: &mut Vec<u8>) {
    if width == 0 {
        return;
    }
    let at = out.len();
    out.resize(at + 4 * width as usize, 0);
    let bytes = &mut out[at..];
    let mut words = bytes.chunks_exact_mut(8);
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &v in values {
        acc |= v << bits;
        bits += width;
        if bits >= 64 {
            if let Some(word) = words.next() {
                word.copy_from_slice(&acc.to_le_bytes());
            }
            bits -= 64;
            // The bits of `v` that did not fit.
            acc = if bits == 0 { 0 } else { v >> (width - bits) };
        }
    }
    // 32 values of any width fill whole bytes; the tail is under a word.
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&acc.to_le_bytes()[..n]);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader written from the format description.
    fn decode(mut bytes: &[u8]) -> Vec<i64> {
        let varint = |bytes: &mut &[u8]| {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let b = bytes[0];
                *bytes = &bytes[1..];
                v |= u64::from(b & 0x7f) << shift;
                shift += 7;
                if b & 0x80 == 0 {
                    return v;
                }
            }
        };
        let unzigzag = |v: u64| ((v >> 1) as i64) ^ -((v & 1) as i64);
        let block = varint(&mut bytes) as usize;
        let minis = varint(&mut bytes) as usize;
        let count = varint(&mut bytes) as usize;
        let mut out = vec![unzigzag(varint(&mut bytes))];
        let per_mini = block / minis;
        while out.len() < count {
            let min = unzigzag(varint(&mut bytes));
            let widths: Vec<usize> = bytes[..minis].iter().map(|&w| w as usize).collect();
            bytes = &bytes[minis..];
            for w in widths {
                if out.len() >= count {
                    break;
                }
                let (packed, rest) = bytes.split_at(per_mini * w / 8);
                bytes = rest;
                for k in 0..per_mini {
                    let mut v = 0u64;
                    for b in 0..w {
                        let bit = k * w + b;
                        v |= u64::from(packed[bit / 8] >> (bit % 8) & 1) << b;
                    }
                    if out.len() < count {
                        let previous = *out.last().unwrap();
                        out.push(previous.wrapping_add(min).wrapping_add(v as i64));
                    }
                }
            }
        }
        assert!(
            bytes.is_empty(),
            "{} bytes after the last block",
            bytes.len()
        );
        out
    }

    fn round_trip(values: &[i64]) {
        let mut out = Vec::new();
        encode(values, &mut out);
        if values.is_empty() {
            assert_eq!(out, [128, 1, 4, 0, 0]);
            return;
        }
        assert_eq!(decode(&out), values);
    }

    #[test]
    fn edges() {
        round_trip(&[]);
        round_trip(&[42]);
        round_trip(&[i64::MIN, i64::MAX, 0, -1, i64::MAX, i64::MIN]);
        round_trip(&[7; 1000]);
    }

    #[test]
    fn times_and_durations() {
        // Nanosecond times in order with jitter, then durations.
        let mut t = 1_700_000_000_000_000_000i64;
        let times: Vec<i64> = (0..10_000)
            .map(|i: i64| {
                t += (i * 7919) % 100_000;
                t
            })
            .collect();
        round_trip(&times);
        let durations: Vec<i64> = (0..1_001).map(|i: i64| (i * i * 31) % 1_000_003).collect();
        round_trip(&durations);
    }

    #[test]
    fn every_length_around_block_edges() {
        for n in [1, 2, 31, 32, 33, 127, 128, 129, 130, 255, 256, 257, 16_384] {
            let v: Vec<i64> = (0..n as i64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as i64))
                .collect();
            round_trip(&v);
            let small: Vec<i64> = (0..n as i64).map(|i| (i % 5) - 2).collect();
            round_trip(&small);
        }
    }
}
