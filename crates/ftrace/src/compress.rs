//! Decompression of v7 blocks (metadata sections and ring-buffer chunks).

use std::io::Read;

/// A compression algorithm named in a v7 file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    /// trace-cmd's "zlib" (zlib-wrapped deflate, from `compress2`).
    Zlib,
    Zstd,
}

impl Codec {
    /// `Ok(None)` for "none" (an uncompressed v7 file).
    pub(crate) fn from_name(name: &str) -> Result<Option<Codec>, String> {
        match name {
            "none" | "" => Ok(None),
            "zlib" => Ok(Some(Codec::Zlib)),
            "zstd" => Ok(Some(Codec::Zstd)),
            other => Err(format!(
                "compression algorithm {other:?} (known: zlib, zstd)"
            )),
        }
    }

    /// Decompresses a block that must expand to exactly `expected` bytes.
    ///
    /// Output is capped at `expected` (plus one byte, to notice overlong
    /// data) and grows as it is produced, so a lying size field cannot make
    /// this allocate more than the data really expands to.
    pub(crate) fn decompress(self, data: &[u8], expected: usize) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(expected.min(1 << 20));
        let limit = expected as u64 + 1;
        let result = match self {
            Codec::Zlib => {
                let r = flate2::read::ZlibDecoder::new(data)
                    .take(limit)
                    .read_to_end(&mut out);
                if r.is_err() && out.is_empty() {
                    // Accept raw deflate too, as other writers may use it.
                    flate2::read::DeflateDecoder::new(data)
                        .take(limit)
                        .read_to_end(&mut out)
                } else {
                    r
                }
            }
            Codec::Zstd => zstd::stream::read::Decoder::with_buffer(data)
                .and_then(|d| d.take(limit).read_to_end(&mut out)),
        };
        result.map_err(|e| format!("{self:?} decompression failed: {e}"))?;
        if out.len() != expected {
            return Err(format!(
                "{self:?} block expands to {}{} bytes, its header says {expected}",
                out.len(),
                if out.len() > expected { "+" } else { "" },
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn round_trips_and_checks_sizes() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        let z = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(Codec::Zstd.decompress(&z, data.len()).unwrap(), data);
        assert!(Codec::Zstd.decompress(&z, data.len() - 1).is_err());
        assert!(Codec::Zstd.decompress(&z, data.len() + 1).is_err());
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&data).unwrap();
        let zl = enc.finish().unwrap();
        assert_eq!(Codec::Zlib.decompress(&zl, data.len()).unwrap(), data);
        assert!(Codec::Zlib
            .decompress(&zl[..zl.len() / 2], data.len())
            .is_err());
        assert!(Codec::Zstd.decompress(b"garbage", 10).is_err());
    }
}
