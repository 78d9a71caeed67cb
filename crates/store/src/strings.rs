//! String columns dictionary-encoded here, not in the parquet crate.
//!
//! The crate's column writer hashes and compares every string value to find
//! its dictionary entry: a tenth of a whole `analyze`, for tables whose
//! strings are a few thousand distinct values repeated millions of times.
//! The values reaching a table are mostly the same shared buffers
//! ([`crate::table::interned`], static labels), so here a value is looked
//! up by its address first, and by its bytes only the first time an address
//! is seen in a row group. The row group's chunk (dictionary page, one data
//! page of indices, offset index) is then assembled with the crate's page
//! writer and spliced into the file.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ColumnChunkMetaData, OffsetIndexBuilder, PageEncodingStats};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescriptor;

use deepspan_analysis::FastMap;

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
    by_address: FastMap<(usize, usize), u32>,
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

    /// Whether [`write_chunk`] may write this column: a dictionary of
    /// reasonable size.
    pub fn fits_dictionary(&self) -> bool {
        self.value_bytes <= DICTIONARY_BYTES
    }

    /// The non-null values in row order (for the crate's writer, when the
    /// dictionary is too large).
    pub fn values(&self) -> impl Iterator<Item = &Bytes> {
        self.ids.iter().map(|&i| &self.values[i as usize])
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
/// RLE_DICTIONARY data page (v1), both LZ4_RAW, as the crate's own writer
/// lays them out. `defs` are the definition levels of an optional column,
/// one per row. Returns the chunk's bytes and what
/// `SerializedRowGroupWriter::append_column` needs to splice them in.
pub fn write_chunk(
    column: &StringColumn,
    defs: Option<&[i16]>,
    rows: usize,
    descr: Arc<ColumnDescriptor>,
) -> Result<(Bytes, ColumnCloseResult)> {
    let mut dictionary = Vec::with_capacity(column.value_bytes + 4 * column.values.len());
    for v in &column.values {
        let len = u32::try_from(v.len())
            .map_err(|_| ParquetError::General(format!("a string of {} bytes", v.len())))?;
        dictionary.extend_from_slice(&len.to_le_bytes());
        dictionary.extend_from_slice(v);
    }

    let mut data = Vec::with_capacity(column.ids.len() * 2 + 16);
    if let Some(defs) = defs {
        let levels: Vec<u32> = defs.iter().map(|&d| d as u32).collect();
        let mut encoded = Vec::new();
        rle::encode(&levels, 1, &mut encoded);
        let len = u32::try_from(encoded.len()).expect("levels of one row group");
        data.extend_from_slice(&len.to_le_bytes());
        data.extend_from_slice(&encoded);
    }
    let width = rle::bit_width(column.values.len().saturating_sub(1) as u32);
    data.push(width);
    rle::encode(&column.ids, width, &mut data);

    let mut sink = TrackedWrite::new(Vec::new());
    let (dictionary_page, data_page) = {
        let mut pages = SerializedPageWriter::new(&mut sink);
        let dictionary_page = pages.write_page(CompressedPage::new(
            Page::DictionaryPage {
                buf: Bytes::from(lz4_flex::block::compress(&dictionary)),
                num_values: column.values.len() as u32,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            },
            dictionary.len(),
        ))?;
        let data_page = pages.write_page(CompressedPage::new(
            Page::DataPage {
                buf: Bytes::from(lz4_flex::block::compress(&data)),
                // Rows, nulls included, as v1 pages count them.
                num_values: rows as u32,
                encoding: Encoding::RLE_DICTIONARY,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            },
            data.len(),
        ))?;
        pages.close()?;
        (dictionary_page, data_page)
    };
    let bytes = Bytes::from(sink.into_inner()?);

    let encodings = [Encoding::PLAIN, Encoding::RLE, Encoding::RLE_DICTIONARY];
    let metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(Compression::LZ4_RAW)
        .set_encodings_mask(EncodingMask::new_from_encodings(encodings.iter()))
        .set_page_encoding_stats(vec![
            PageEncodingStats {
                page_type: PageType::DICTIONARY_PAGE,
                encoding: Encoding::PLAIN,
                count: 1,
            },
            PageEncodingStats {
                page_type: PageType::DATA_PAGE,
                encoding: Encoding::RLE_DICTIONARY,
                count: 1,
            },
        ])
        .set_total_compressed_size(
            (dictionary_page.compressed_size + data_page.compressed_size) as i64,
        )
        .set_total_uncompressed_size(
            (dictionary_page.uncompressed_size + data_page.uncompressed_size) as i64,
        )
        .set_num_values(rows as i64)
        .set_dictionary_page_offset(Some(dictionary_page.offset as i64))
        .set_data_page_offset(data_page.offset as i64)
        .build()?;
    let mut offsets = OffsetIndexBuilder::new();
    offsets.append_row_count(rows as i64);
    offsets.append_offset_and_size(data_page.offset as i64, data_page.compressed_size as i32);
    let close = ColumnCloseResult {
        bytes_written: bytes.len() as u64,
        rows_written: rows as u64,
        metadata,
        bloom_filter: None,
        column_index: None,
        offset_index: Some(offsets.build()),
    };
    Ok((bytes, close))
}
