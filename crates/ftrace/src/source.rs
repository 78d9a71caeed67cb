//! Where the bytes come from (a file read with positioned reads, or memory),
//! and a cursor for the small, sequential metadata reads.

use std::fs::File;
use std::os::unix::fs::FileExt;

use bytes::{Bytes, BytesMut};

use crate::error::{Error, Location};

/// The bytes of a trace.dat file.
///
/// Files are read with `pread`, so any number of per-CPU iterators can read
/// the same file at once without sharing a seek position, and nothing is
/// mapped: memory stays bounded by what the iterators hold.
#[derive(Debug)]
pub(crate) enum Source {
    File { file: File, len: u64 },
    Memory(Bytes),
}

impl Source {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Source::File { len, .. } => *len,
            Source::Memory(b) => b.len() as u64,
        }
    }

    /// Reads exactly `len` bytes at `offset`; `what` names them for the error.
    pub(crate) fn read(&self, offset: u64, len: usize, what: &str) -> Result<Bytes, Error> {
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len());
        if !fits {
            return Err(Error::malformed(
                Location::File(offset),
                format!(
                    "{what}: {len} bytes expected, but the file ends at {:#x}",
                    self.len()
                ),
            ));
        }
        match self {
            Source::Memory(b) => Ok(b.slice(offset as usize..offset as usize + len)),
            Source::File { file, .. } => {
                let mut buf = vec![0u8; len];
                file.read_exact_at(&mut buf, offset)
                    .map_err(|source| Error::Io {
                        at: Location::File(offset),
                        source,
                    })?;
                Ok(Bytes::from(buf))
            }
        }
    }
}

impl Source {
    /// Reads exactly `len` bytes at `offset` for the ring-buffer reader.
    /// Memory sources are sliced; file data goes into `buffer`, whose
    /// allocation is reused when it has room.
    pub(crate) fn read_into(
        &self,
        offset: u64,
        len: usize,
        mut buffer: BytesMut,
        what: &str,
    ) -> Result<Bytes, Error> {
        let Source::File { file, .. } = self else {
            return self.read(offset, len, what);
        };
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len());
        if !fits {
            // Out of bounds: let `read` say so.
            return self.read(offset, len, what);
        }
        // Only grows (and zeroes) the first time; later chunks overwrite.
        buffer.resize(len, 0);
        file.read_exact_at(&mut buffer, offset)
            .map_err(|source| Error::Io {
                at: Location::File(offset),
                source,
            })?;
        Ok(buffer.freeze())
    }
}

/// Byte order of the numbers in a trace.dat file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endian {
    pub big: bool,
}

impl Endian {
    #[inline]
    pub(crate) fn u16(self, b: [u8; 2]) -> u16 {
        if self.big {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }
    #[inline]
    pub(crate) fn u32(self, b: [u8; 4]) -> u32 {
        if self.big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }
    #[inline]
    pub(crate) fn u64(self, b: [u8; 8]) -> u64 {
        if self.big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        }
    }

    /// Reads an unsigned number of `size` (1, 2, 4 or 8) bytes at `off`;
    /// `None` when out of bounds or of another size.
    #[inline]
    pub(crate) fn uint(self, data: &[u8], off: usize, size: usize) -> Option<u64> {
        let b = data.get(off..off.checked_add(size)?)?;
        Some(match size {
            1 => u64::from(b[0]),
            2 => u64::from(self.u16(b.try_into().ok()?)),
            4 => u64::from(self.u32(b.try_into().ok()?)),
            8 => self.u64(b.try_into().ok()?),
            _ => return None,
        })
    }

    /// Like [`Endian::uint`], sign-extended from `size` bytes.
    #[inline]
    pub(crate) fn int(self, data: &[u8], off: usize, size: usize) -> Option<i64> {
        let v = self.uint(data, off, size)?;
        let shift = 64 - 8 * size as u32;
        Some(((v << shift) as i64) >> shift)
    }
}

/// Sequential reader over a [`Source`] for metadata (headers, formats,
/// options). Reads through a window so that many small reads cost few
/// system calls; large blobs that are not needed are skipped unread.
pub(crate) struct Cursor<'a> {
    src: &'a Source,
    pos: u64,
    window: Bytes,
    window_start: u64,
    endian: Endian,
    /// Where offset 0 of `src` is in the file, for error messages.
    origin: Origin,
    /// Set when a read was refused because the source ends before the
    /// bytes it asked for: the file is cut short (or a size field lies).
    ran_out: bool,
}

/// What offsets of a cursor's source mean.
#[derive(Clone, Copy)]
pub(crate) enum Origin {
    /// The source is the file itself.
    File,
    /// The source is the uncompressed content of a block at this file offset.
    Block(u64),
}

const WINDOW: usize = 64 * 1024;

impl<'a> Cursor<'a> {
    pub(crate) fn new(src: &'a Source, pos: u64, endian: Endian, origin: Origin) -> Cursor<'a> {
        Cursor {
            src,
            pos,
            window: Bytes::new(),
            window_start: 0,
            endian,
            origin,
            ran_out: false,
        }
    }

    /// A new cursor on the same source, at `pos`.
    pub(crate) fn new_like(other: &Cursor<'a>, pos: u64) -> Cursor<'a> {
        Cursor::new(other.src, pos, other.endian, other.origin)
    }

    pub(crate) fn source(&self) -> &'a Source {
        self.src
    }

    pub(crate) fn endian(&self) -> Endian {
        self.endian
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    pub(crate) fn set_endian(&mut self, endian: Endian) {
        self.endian = endian;
    }

    pub(crate) fn seek(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// Whether a read failed because the source ended before its bytes.
    pub(crate) fn ran_out(&self) -> bool {
        self.ran_out
    }

    pub(crate) fn remaining(&self) -> u64 {
        self.src.len().saturating_sub(self.pos)
    }

    /// The file location of offset `pos` of this cursor's source.
    pub(crate) fn location_of(&self, pos: u64) -> Location {
        match self.origin {
            Origin::File => Location::File(pos),
            Origin::Block(block) => Location::Compressed { block, offset: pos },
        }
    }

    pub(crate) fn location(&self) -> Location {
        self.location_of(self.pos)
    }

    pub(crate) fn error(&self, what: impl Into<String>) -> Error {
        Error::malformed(self.location(), what)
    }

    fn error_at(&self, pos: u64, what: impl Into<String>) -> Error {
        Error::malformed(self.location_of(pos), what)
    }

    /// The next `n` bytes, without copying when they are in the window.
    pub(crate) fn bytes(&mut self, n: u64, what: &str) -> Result<Bytes, Error> {
        if n > self.remaining() {
            self.ran_out = true;
            return Err(self.error(format!(
                "{what}: {n} bytes expected, only {} left",
                self.remaining()
            )));
        }
        let n = n as usize;
        let in_window = self.pos >= self.window_start
            && self.pos + n as u64 <= self.window_start + self.window.len() as u64;
        let out = if in_window {
            let at = (self.pos - self.window_start) as usize;
            self.window.slice(at..at + n)
        } else if n >= WINDOW {
            self.src
                .read(self.pos, n, what)
                .map_err(|e| self.relocate(e))?
        } else {
            let len = (WINDOW as u64).min(self.remaining()) as usize;
            self.window = self
                .src
                .read(self.pos, len, what)
                .map_err(|e| self.relocate(e))?;
            self.window_start = self.pos;
            self.window.slice(0..n)
        };
        self.pos += n as u64;
        Ok(out)
    }

    /// Errors of the underlying source speak of source offsets; restate
    /// them as file locations.
    fn relocate(&self, e: Error) -> Error {
        match e {
            Error::Malformed {
                at: Location::File(o),
                what,
            } => Error::Malformed {
                at: self.location_of(o),
                what,
            },
            Error::Io {
                at: Location::File(o),
                source,
            } => Error::Io {
                at: self.location_of(o),
                source,
            },
            other => other,
        }
    }

    pub(crate) fn skip(&mut self, n: u64, what: &str) -> Result<(), Error> {
        if n > self.remaining() {
            self.ran_out = true;
            return Err(self.error(format!(
                "{what}: {n} bytes expected, only {} left",
                self.remaining()
            )));
        }
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], Error> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&b);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, Error> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, Error> {
        let b = self.array(what)?;
        Ok(self.endian.u16(b))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, Error> {
        let b = self.array(what)?;
        Ok(self.endian.u32(b))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, Error> {
        let b = self.array(what)?;
        Ok(self.endian.u64(b))
    }

    /// Checks that the next bytes are exactly `magic`.
    pub(crate) fn expect(&mut self, magic: &[u8], what: &str) -> Result<(), Error> {
        let at = self.pos;
        let got = self.bytes(magic.len() as u64, what)?;
        if got != magic {
            return Err(self.error_at(
                at,
                format!("expected {what} {:?}, found {:?}", show(magic), show(&got)),
            ));
        }
        Ok(())
    }

    /// A NUL-terminated string (the NUL is consumed, not returned).
    pub(crate) fn cstr(&mut self, what: &str) -> Result<String, Error> {
        let start = self.pos;
        let mut out = Vec::new();
        loop {
            if self.remaining() == 0 {
                self.ran_out = true;
                return Err(self.error_at(start, format!("{what}: string without terminating NUL")));
            }
            // Read in small steps: strings are short and the window makes
            // each step a memory access.
            let step = self.remaining().min(256);
            let chunk = self.bytes(step, what)?;
            if let Some(nul) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                self.pos -= step - nul as u64 - 1;
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk);
            if out.len() > 1 << 20 {
                return Err(self.error_at(start, format!("{what}: string longer than 1 MiB")));
            }
        }
    }
}

/// Shows bytes as text for error messages.
fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers_in_both_orders() {
        let le = Endian { big: false };
        let be = Endian { big: true };
        let data = [0xfe, 0xff, 0xff, 0xff, 1, 2];
        assert_eq!(le.uint(&data, 0, 4), Some(0xffff_fffe));
        assert_eq!(le.int(&data, 0, 4), Some(-2));
        assert_eq!(be.uint(&data, 4, 2), Some(0x0102));
        assert_eq!(le.int(&data, 0, 1), Some(-2));
        assert_eq!(le.uint(&data, 4, 4), None, "out of bounds");
        assert_eq!(le.uint(&data, 0, 3), None, "odd size");
        assert_eq!(le.uint(&data, usize::MAX, 2), None);
    }

    #[test]
    fn cursor_reads_across_its_window_and_reports_offsets() {
        let mut data = vec![b'x'; WINDOW + 10];
        data[WINDOW - 2..WINDOW + 3].copy_from_slice(b"abc\0d");
        let src = Source::Memory(Bytes::from(data));
        let mut c = Cursor::new(&src, WINDOW as u64 - 2, Endian { big: false }, Origin::File);
        assert_eq!(c.cstr("s").unwrap(), "abc");
        assert_eq!(c.pos(), WINDOW as u64 + 2);
        assert_eq!(c.u8("d").unwrap(), b'd');
        let e = c.bytes(100, "tail").unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("trace.dat offset {:#x}: tail", WINDOW + 3)),
            "{e}"
        );
        let mut c = Cursor::new(&src, 0, Endian { big: false }, Origin::Block(0x40));
        c.skip(5, "x").unwrap();
        let e = c.expect(b"yy", "magic").unwrap_err().to_string();
        assert!(
            e.contains("0x40 (compressed block), uncompressed offset 0x5"),
            "{e}"
        );
        let mut c = Cursor::new(&src, 0, Endian { big: false }, Origin::File);
        c.seek(WINDOW as u64 + 4);
        assert!(c.cstr("unterminated").is_err());
    }
}
