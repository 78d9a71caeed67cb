//! Column chunks encoded here rather than by the parquet crate's column
//! writer, assembled with the crate's page writer and metadata builders and
//! spliced into the file with `SerializedRowGroupWriter::append_column`.
//!
//! The crate's writer is general (any page size, page statistics, bloom
//! filters, nested levels); ours writes one row group of a flat column as
//! one data page, which is all the tables need, at a fraction of the cost
//! per value (see `strings.rs` and `delta.rs` for what it saves).

use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, EncodingMask, PageType};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::Result;
use parquet::file::metadata::{ColumnChunkMetaData, OffsetIndexBuilder, PageEncodingStats};
use parquet::file::statistics::{Statistics, ValueStatistics};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescriptor;

use crate::{delta, rle};

/// One row group of one column, encoded.
pub struct Chunk {
    /// A PLAIN dictionary page's body and its number of values.
    pub dictionary: Option<(Vec<u8>, usize)>,
    /// The data page's body: levels (see [`write_levels`]) then values.
    pub data: Vec<u8>,
    /// How the values in `data` are encoded.
    pub encoding: Encoding,
    /// Rows, nulls included.
    pub rows: usize,
    pub compression: Compression,
    /// Min/max and null count of the chunk, where the table keeps them.
    pub statistics: Option<Statistics>,
}

/// A data page body of about `capacity` bytes of values, begun with the
/// definition levels of an optional column.
pub fn page_body(defs: Option<&[i16]>, capacity: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(capacity + 64);
    if let Some(defs) = defs {
        write_levels(defs, &mut data);
    }
    data
}

/// Appends the definition levels of an optional column (1 = present) as a
/// v1 data page has them: their byte length, then RLE / bit-packed.
fn write_levels(defs: &[i16], data: &mut Vec<u8>) {
    let at = data.len();
    data.extend_from_slice(&[0; 4]);
    rle::encode(defs, 1, data);
    let len = (data.len() - at - 4) as u32;
    data[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Writes the chunk's pages and returns their bytes with what
/// `append_column` needs to splice them in: the chunk's metadata and its
/// offset index (one page).
pub fn assemble(chunk: Chunk, descr: Arc<ColumnDescriptor>) -> Result<(Bytes, ColumnCloseResult)> {
    let compress = |body: &[u8]| match chunk.compression {
        Compression::LZ4_RAW => Bytes::from(lz4_flex::block::compress(body)),
        _ => Bytes::copy_from_slice(body),
    };
    let mut sink = TrackedWrite::new(Vec::new());
    let (dictionary_page, data_page) = {
        let mut pages = SerializedPageWriter::new(&mut sink);
        let dictionary_page = match &chunk.dictionary {
            Some((body, entries)) => Some(pages.write_page(CompressedPage::new(
                Page::DictionaryPage {
                    buf: compress(body),
                    num_values: *entries as u32,
                    encoding: Encoding::PLAIN,
                    is_sorted: false,
                },
                body.len(),
            ))?),
            None => None,
        };
        let data_page = pages.write_page(CompressedPage::new(
            Page::DataPage {
                buf: compress(&chunk.data),
                // Rows, nulls included, as v1 pages count them.
                num_values: chunk.rows as u32,
                encoding: chunk.encoding,
                def_level_encoding: Encoding::RLE,
                rep_level_encoding: Encoding::RLE,
                statistics: None,
            },
            chunk.data.len(),
        ))?;
        pages.close()?;
        (dictionary_page, data_page)
    };
    let bytes = Bytes::from(sink.into_inner()?);

    let mut encodings = EncodingMask::default();
    encodings.insert(Encoding::RLE);
    encodings.insert(chunk.encoding);
    let mut page_stats = Vec::new();
    if dictionary_page.is_some() {
        encodings.insert(Encoding::PLAIN);
        page_stats.push(PageEncodingStats {
            page_type: PageType::DICTIONARY_PAGE,
            encoding: Encoding::PLAIN,
            count: 1,
        });
    }
    page_stats.push(PageEncodingStats {
        page_type: PageType::DATA_PAGE,
        encoding: chunk.encoding,
        count: 1,
    });
    let pages = dictionary_page.iter().chain([&data_page]);
    let compressed: usize = pages.clone().map(|p| p.compressed_size).sum();
    let uncompressed: usize = pages.map(|p| p.uncompressed_size).sum();
    let mut metadata = ColumnChunkMetaData::builder(descr)
        .set_compression(chunk.compression)
        .set_encodings_mask(encodings)
        .set_page_encoding_stats(page_stats)
        .set_total_compressed_size(compressed as i64)
        .set_total_uncompressed_size(uncompressed as i64)
        .set_num_values(chunk.rows as i64)
        .set_dictionary_page_offset(dictionary_page.map(|p| p.offset as i64))
        .set_data_page_offset(data_page.offset as i64);
    if let Some(statistics) = chunk.statistics {
        metadata = metadata.set_statistics(statistics);
    }
    let mut offsets = OffsetIndexBuilder::new();
    offsets.append_row_count(chunk.rows as i64);
    offsets.append_offset_and_size(data_page.offset as i64, data_page.compressed_size as i32);
    let close = ColumnCloseResult {
        bytes_written: bytes.len() as u64,
        rows_written: chunk.rows as u64,
        metadata: metadata.build()?,
        bloom_filter: None,
        column_index: None,
        offset_index: Some(offsets.build()),
    };
    Ok((bytes, close))
}

/// One row group of a 64-bit integer column, DELTA_BINARY_PACKED; with
/// min/max statistics when `statistics` says how to order the values.
pub fn int64_chunk(
    values: &[i64],
    defs: Option<&[i16]>,
    rows: usize,
    compression: Compression,
    statistics: Option<Order>,
) -> Chunk {
    let mut data = page_body(defs, values.len() * 2);
    delta::encode(values, &mut data);
    let nulls = Some((rows - values.len()) as u64);
    let statistics = statistics.map(|order| {
        let (min, max) = match order {
            Order::Signed => (values.iter().min(), values.iter().max()),
            Order::Unsigned => (
                values.iter().min_by_key(|&&v| v as u64),
                values.iter().max_by_key(|&&v| v as u64),
            ),
        };
        Statistics::Int64(
            ValueStatistics::new(min.copied(), max.copied(), None, nulls, false)
                .with_backwards_compatible_min_max(order == Order::Signed),
        )
    });
    Chunk {
        dictionary: None,
        data,
        encoding: Encoding::DELTA_BINARY_PACKED,
        rows,
        compression,
        statistics,
    }
}

/// One row group of a 32-bit integer column, PLAIN (little-endian) and
/// LZ4_RAW; min/max where `statistics` is set (signed).
pub fn int32_chunk(values: &[i32], defs: Option<&[i16]>, rows: usize, statistics: bool) -> Chunk {
    let mut data = page_body(defs, values.len() * 4);
    for v in values {
        data.extend_from_slice(&v.to_le_bytes());
    }
    let nulls = Some((rows - values.len()) as u64);
    let statistics = statistics.then(|| {
        let (min, max) = (values.iter().min().copied(), values.iter().max().copied());
        Statistics::Int32(
            ValueStatistics::new(min, max, None, nulls, false)
                .with_backwards_compatible_min_max(true),
        )
    });
    Chunk {
        dictionary: None,
        data,
        encoding: Encoding::PLAIN,
        rows,
        compression: Compression::LZ4_RAW,
        statistics,
    }
}

/// One row group of a boolean column, PLAIN (one bit per value, least
/// significant first) and LZ4_RAW.
pub fn bool_chunk(values: &[bool], defs: Option<&[i16]>, rows: usize) -> Chunk {
    let mut data = page_body(defs, values.len() / 8);
    for byte in values.chunks(8) {
        data.push(
            byte.iter()
                .enumerate()
                .fold(0u8, |b, (i, &v)| b | (u8::from(v) << i)),
        );
    }
    Chunk {
        dictionary: None,
        data,
        encoding: Encoding::PLAIN,
        rows,
        compression: Compression::LZ4_RAW,
        statistics: None,
    }
}

/// How a column's values compare, for its min/max.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Signed,
    Unsigned,
}
