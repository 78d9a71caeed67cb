//! String columns dictionary-encoded here, not in the parquet crate.
//!
//! The crate's column writer hashes and compares every string value to find
//! its dictionary entry: a tenth of a whole `analyze`, for tables whose
//! strings are a few thousand distinct values repeated millions of times.
//! The values reaching a table are mostly the same shared buffers
//! ([`crate::table::interned`], static labels), so here a value is looked
//! up by its address first, and by its bytes only the first time an address
//! is seen in a row group. The row group's chunk is a dictionary page and
//! one data page of indices (see `chunk.rs`).

use std::collections::HashMap;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding};
use parquet::errors::{ParquetError, Result};

use rustc_hash::FxHashMap;

use crate::chunk::{page_body, Chunk};
use crate::rle;

/// Past this many bytes of distinct values in a row group, a dictionary
/// stops paying (the parquet crate's default limit): the column is written
/// by the crate's writer, which falls back to plain values.
pub const DICTIONARY_BYTES: usize = 1 << 20;

/// One row group's values of a string column, as dictionary indices.
#[derive(Default)]
pub struct StringColumn {
    /// Per non-null value: its index in `values`.
    ids: Vec<u32>,
    /// The distinct values, in the order first seen.
    values: Vec<Bytes>,
    value_bytes: usize,
    by_address: FxHashMap<(usize, usize), u32>,
    by_content: HashMap<Bytes, u32>,
    /// Values whose bytes were already in `values` at another address: kept
    /// so that, while `by_address` names their address, no other value can
    /// be allocated there.
    aliases: Vec<Bytes>,
    /// The previous value's address, length and index: runs of one value
    /// (a request's span id on each of its rows) skip the map.
    last: Option<(usize, usize, u32)>,
}

impl StringColumn {
    /// Appends a value; cheap when the same buffer was appended before.
    /// Borrowed: cloning and dropping a [`Bytes`] per row are two indirect
    /// calls, more than the lookup.
    #[inline]
    pub fn push(&mut self, v: &Bytes) {
        self.push_at(v, || v.clone())
    }

    /// Appends a string known at compile time.
    #[inline]
    pub fn push_static(&mut self, v: &'static [u8]) {
        self.push_at(v, || Bytes::from_static(v))
    }

    /// `owner` makes a [`Bytes`] over exactly the memory of `v`: kept while
    /// the row group's map names that address.
    #[inline(always)]
    fn push_at(&mut self, v: &[u8], owner: impl FnOnce() -> Bytes) {
        let address = (v.as_ptr() as usize, v.len());
        if let Some((a, n, id)) = self.last {
            if (a, n) == address {
                return self.ids.push(id);
            }
        }
        let id = match self.by_address.get(&address) {
            Some(&id) => id,
            None => self.add_address(address, owner()),
        };
        self.last = Some((address.0, address.1, id));
        self.ids.push(id);
    }

    /// Appends a value that is not a shared buffer: looked up by its bytes,
    /// copied only when new.
    pub fn push_str(&mut self, v: &str) {
        let id = match self.by_content.get(v.as_bytes()) {
            Some(&id) => id,
            None => self.add_value(Bytes::copy_from_slice(v.as_bytes())),
        };
        self.ids.push(id);
    }

    #[cold]
    fn add_address(&mut self, address: (usize, usize), v: Bytes) -> u32 {
        let id = match self.by_content.get(&v) {
            Some(&id) => {
                self.aliases.push(v);
                id
            }
            None => self.add_value(v),
        };
        self.by_address.insert(address, id);
        id
    }

    fn add_value(&mut self, v: Bytes) -> u32 {
        let id = u32::try_from(self.values.len()).expect("a row group has fewer than 2^32 values");
        self.value_bytes += v.len();
        self.by_content.insert(v.clone(), id);
        self.values.push(v);
        id
    }

    /// Whether [`string_chunk`] may write this column: a dictionary of
    /// reasonable size.
    pub fn fits_dictionary(&self) -> bool {
        self.value_bytes <= DICTIONARY_BYTES
    }

    /// The non-null values in row order (for the crate's writer, when the
    /// dictionary is too large).
    pub fn values(&self) -> impl Iterator<Item = &Bytes> {
        self.ids.iter().map(|&i| &self.values[i as usize])
    }

    /// Per non-null value its index in the distinct values, and those
    /// values (for a copy kept in memory, [`crate::kept`]).
    pub(crate) fn parts(&self) -> (&[u32], &[Bytes]) {
        (&self.ids, &self.values)
    }

    /// Values (not nulls) pushed in this row group.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Forgets the row group, keeping the allocations.
    pub fn clear(&mut self) {
        self.ids.clear();
        self.values.clear();
        self.value_bytes = 0;
        self.by_address.clear();
        self.by_content.clear();
        self.aliases.clear();
        self.last = None;
    }
}

/// Encodes one row group's column chunk: a PLAIN dictionary page and one
/// RLE_DICTIONARY data page, both LZ4_RAW, as the crate's own writer lays
/// them out. `defs` are the definition levels of an optional column, one
/// per row.
pub fn string_chunk(column: &StringColumn, defs: Option<&[i16]>, rows: usize) -> Result<Chunk> {
    let mut dictionary = Vec::with_capacity(column.value_bytes + 4 * column.values.len());
    for v in &column.values {
        let len = u32::try_from(v.len())
            .map_err(|_| ParquetError::General(format!("a string of {} bytes", v.len())))?;
        dictionary.extend_from_slice(&len.to_le_bytes());
        dictionary.extend_from_slice(v);
    }
    let mut data = page_body(defs, column.ids.len() * 2);
    let width = rle::bit_width(column.values.len().saturating_sub(1) as u32);
    data.push(width);
    rle::encode(&column.ids, width, &mut data);
    Ok(Chunk {
        dictionary: Some((dictionary, column.values.len())),
        data,
        encoding: Encoding::RLE_DICTIONARY,
        rows,
        compression: Compression::LZ4_RAW,
        statistics: None,
    })
}
