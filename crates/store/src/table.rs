//! Parquet tables: the file and its column buffers (`TableFile`,
//! `Buffer`), a row-oriented writer over them, and a reader of whole rows
//! back.
//!
//! Values are pushed column by column for each row (`i64(…)`, `str(…)`,
//! …, then [`TableWriter::end_row`]); every [`ROW_GROUP`] rows the buffered
//! columns are written as one row group (encoded in `chunk.rs`), so memory
//! stays bounded whatever the table size. The large tables fill the same
//! buffers through typed columns instead (`columns.rs`).

use std::collections::HashSet;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, IntType, LogicalType, Repetition, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DataType, DoubleType};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};
use parquet::record::Field;
use parquet::schema::types::ColumnDescriptor;
use parquet::schema::types::{ColumnPath, Type};

use crate::chunk::{assemble, bool_chunk, int32_chunk, int64_chunk, Order};
use crate::kept::KeptTable;
use crate::strings::{string_chunk, StringColumn};
use crate::Error;

/// Rows per row group. The rows of a group are buffered until it is
/// written, and several tables are written at once: 16 Ki rows keep that
/// to a few MB per table (64 Ki cost 50 MB more peak memory on a 446 MB
/// trace) for under 1 % larger files.
pub const ROW_GROUP: usize = 16 * 1024;

/// Columns that get min/max statistics per row group: what query engines
/// skip row groups by (time ranges, threads). On other columns computing
/// them cost about a third of the time of writing an integer.
const PRUNING_COLUMNS: &[&str] = &["tid", "pid", "start_ns", "end_ns", "duration_ns"];

/// Columns of times and durations, left uncompressed: their delta-packed
/// values are nearly all distinct, so LZ4 made them larger (a critical
/// path's start_ns: 3 711 580 bytes rather than 3 697 081) and cost about
/// 1 % of the instructions of a whole `analyze`.
const TIME_COLUMNS: &[&str] = &["start_ns", "end_ns", "duration_ns"];

/// The most bytes of string values [`interned`] keeps for the life of the
/// process.
pub const INTERNED_BYTES: usize = 16 << 20;

struct Interner {
    strings: HashSet<&'static [u8]>,
    bytes: usize,
}

static INTERNER: Mutex<Option<Interner>> = Mutex::new(None);

/// A string value that repeats across rows (thread names, system call
/// labels, span ids), as a buffer that costs nothing to clone or drop and
/// that string columns recognise by its address.
///
/// A reference-counted [`Bytes`] costs an atomic increment per row and a
/// decrement per flushed value, which measured about a tenth of writing
/// the critical path. The distinct values of a run are few (threads,
/// labels, spans), so they are kept for good, deduplicated process-wide;
/// past [`INTERNED_BYTES`] of them (a long-lived process, hostile input)
/// values are reference counted instead, so memory stays bounded.
///
/// Takes a process-wide lock: meant for once per distinct value (callers
/// cache the result), not once per row.
pub fn interned(value: &[u8]) -> Bytes {
    // A poisoned lock only means another thread panicked while inserting;
    // the set is still valid.
    let mut guard = INTERNER.lock().unwrap_or_else(|p| p.into_inner());
    let table = guard.get_or_insert_with(|| Interner {
        strings: HashSet::new(),
        bytes: 0,
    });
    if let Some(&kept) = table.strings.get(value) {
        return Bytes::from_static(kept);
    }
    if table.bytes + value.len() > INTERNED_BYTES {
        return Bytes::copy_from_slice(value);
    }
    let kept: &'static [u8] = Box::leak(Box::from(value));
    table.strings.insert(kept);
    table.bytes += kept.len();
    Bytes::from_static(kept)
}

/// The type of a column's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    I32,
    I64,
    /// Stored as INT64 annotated unsigned (pointers, raw arguments).
    U64,
    F64,
    Bool,
    /// UTF-8 text.
    Str,
}

/// A column: name, kind, and whether it may be null.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub kind: Kind,
    pub nullable: bool,
}

impl Column {
    pub const fn new(name: &'static str, kind: Kind) -> Column {
        Column {
            name,
            kind,
            nullable: false,
        }
    }

    pub const fn nullable(name: &'static str, kind: Kind) -> Column {
        Column {
            name,
            kind,
            nullable: true,
        }
    }
}

pub(crate) enum Values {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    Str(StringColumn),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::I32(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::Bool(v) => v.len(),
            Values::Str(v) => v.len(),
        }
    }

    /// Forgets the row group's values, keeping the allocations.
    fn clear(&mut self) {
        match self {
            Values::I32(v) => v.clear(),
            Values::I64(v) => v.clear(),
            Values::F64(v) => v.clear(),
            Values::Bool(v) => v.clear(),
            Values::Str(v) => v.clear(),
        }
    }
}

/// One column's values for the row group being filled.
pub(crate) struct Buffer {
    pub(crate) column: Column,
    /// Its position in the schema.
    index: usize,
    /// The column in the file's schema (for chunks encoded here).
    descr: Arc<ColumnDescriptor>,
    compression: Compression,
    /// How to order values for min/max statistics, where kept.
    statistics: Option<Order>,
    pub(crate) values: Values,
    /// Definition levels (1 = present) of a nullable column.
    pub(crate) defs: Vec<i16>,
}

impl Buffer {
    /// Rows the buffer holds a value or a null for.
    fn rows(&self) -> usize {
        if self.column.nullable {
            self.defs.len()
        } else {
            self.values.len()
        }
    }

    /// Writes the buffer as the next column chunk of `group` and empties
    /// it. Integers, booleans and strings with a dictionary of reasonable
    /// size are encoded here (see chunk.rs); the rest (doubles, strings of
    /// many distinct values) by the crate's column writer.
    fn write(&mut self, group: &mut RowGroup, rows: usize) -> parquet::errors::Result<()> {
        let defs = self.column.nullable.then_some(&self.defs[..]);
        let chunk = match &mut self.values {
            Values::Str(v) if v.fits_dictionary() => Some(string_chunk(v, defs, rows)?),
            Values::I64(v) => Some(int64_chunk(
                v,
                defs,
                rows,
                self.compression,
                self.statistics,
            )),
            Values::I32(v) => Some(int32_chunk(v, defs, rows, self.statistics.is_some())),
            Values::Bool(v) => Some(bool_chunk(v, defs, rows)),
            Values::F64(v) => {
                write_with_crate::<DoubleType>(group, v, defs)?;
                None
            }
            Values::Str(v) => {
                let v: Vec<ByteArray> = v.values().cloned().map(ByteArray::from).collect();
                write_with_crate::<ByteArrayType>(group, &v, defs)?;
                None
            }
        };
        if let Some(chunk) = chunk {
            let (bytes, close) = assemble(chunk, self.descr.clone())?;
            group.append_column(&bytes, close)?;
        }
        self.values.clear();
        self.defs.clear();
        Ok(())
    }
}

/// Writes the next column chunk of `group` with the crate's column writer.
fn write_with_crate<T: DataType>(
    group: &mut RowGroup,
    values: &[T::T],
    defs: Option<&[i16]>,
) -> parquet::errors::Result<()> {
    let Some(mut col) = group.next_column()? else {
        return Err(ParquetError::General("more columns than the schema".into()));
    };
    col.typed::<T>().write_batch(values, defs, None)?;
    col.close()
}

type RowGroup<'a> = SerializedRowGroupWriter<'a, BufWriter<File>>;

/// A Parquet file being written a row group at a time, and the column
/// buffers its row groups are written from.
pub(crate) struct TableFile {
    path: PathBuf,
    writer: SerializedFileWriter<BufWriter<File>>,
    schema: Vec<Column>,
    /// A copy of some columns of every row group written, when asked for
    /// ([`TableFile::keep`]).
    kept: Option<KeptTable>,
}

/// Writes one Parquet file row by row.
pub struct TableWriter {
    file: TableFile,
    buffers: Vec<Buffer>,
    /// Next column of the current row.
    next: usize,
    rows_buffered: usize,
    rows: u64,
    /// The first misuse seen (see [`TableWriter::end_row`]).
    misuse: Option<String>,
}

impl TableFile {
    /// Creates (or truncates) `path` for a table of these columns; returns
    /// the file and an empty buffer per column, in schema order.
    /// `version`: the table's layout version, stored as the file's
    /// `deepspan.table_version` key (tables without one are version 1).
    pub(crate) fn create(
        path: &Path,
        columns: &[Column],
        version: Option<u32>,
    ) -> Result<(TableFile, Vec<Buffer>), Error> {
        let fields = columns
            .iter()
            .map(|c| {
                let (physical, logical) = match c.kind {
                    Kind::I32 => (Physical::INT32, None),
                    Kind::I64 => (Physical::INT64, None),
                    Kind::U64 => (
                        Physical::INT64,
                        Some(LogicalType::Integer(IntType {
                            bit_width: 64,
                            is_signed: false,
                        })),
                    ),
                    Kind::F64 => (Physical::DOUBLE, None),
                    Kind::Bool => (Physical::BOOLEAN, None),
                    Kind::Str => (Physical::BYTE_ARRAY, Some(LogicalType::String)),
                };
                let repetition = if c.nullable {
                    Repetition::OPTIONAL
                } else {
                    Repetition::REQUIRED
                };
                Type::primitive_type_builder(c.name, physical)
                    .with_repetition(repetition)
                    .with_logical_type(logical)
                    .build()
                    .map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::parquet(path, "building the schema", e))?;
        let schema = Type::group_type_builder("schema")
            .with_fields(fields)
            .build()
            .map_err(|e| Error::parquet(path, "building the schema", e))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            // Min/max per row group is what query engines prune with; per
            // page costs time for little.
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_created_by(format!("deepspan {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(version.map(|v| {
                vec![parquet::file::metadata::KeyValue::new(
                    TABLE_VERSION_KEY.to_string(),
                    v.to_string(),
                )]
            }));
        for c in columns {
            // Dictionaries pay for names and small ids; for timestamps and
            // durations (nearly all distinct) the writer would build one only
            // to give it up.
            let dictionary = matches!(c.kind, Kind::Str);
            props = props.set_column_dictionary_enabled(ColumnPath::from(c.name), dictionary);
            if c.kind == Kind::Str || !PRUNING_COLUMNS.contains(&c.name) {
                // Min/max of strings cost byte comparisons per value, and
                // of the other columns prune nothing useful here.
                props = props.set_column_statistics_enabled(
                    ColumnPath::from(c.name),
                    EnabledStatistics::None,
                );
            }
            if c.kind == Kind::I64 {
                // Times in time order, and durations: small deltas, so this
                // packs them better than a general compressor, and fast.
                props = props
                    .set_column_encoding(ColumnPath::from(c.name), Encoding::DELTA_BINARY_PACKED);
                if TIME_COLUMNS.contains(&c.name) {
                    props = props.set_column_compression(
                        ColumnPath::from(c.name),
                        Compression::UNCOMPRESSED,
                    );
                }
            }
        }
        let props = props.build();
        let file = File::create(path).map_err(|e| Error::io(path, "cannot create", e))?;
        // Column chunks arrive whole (chunk.rs) and page headers small: a
        // large buffer would only be one more copy, and a MiB of memory per
        // table being written.
        let writer = SerializedFileWriter::new(
            BufWriter::with_capacity(128 << 10, file),
            Arc::new(schema),
            Arc::new(props),
        )
        .map_err(|e| Error::parquet(path, "starting the file", e))?;
        let buffers = columns
            .iter()
            .enumerate()
            .map(|(i, &column)| Buffer {
                column,
                index: i,
                descr: writer.schema_descr().column(i),
                compression: if TIME_COLUMNS.contains(&column.name) && column.kind == Kind::I64 {
                    Compression::UNCOMPRESSED
                } else {
                    Compression::LZ4_RAW
                },
                statistics: match column.kind {
                    _ if !PRUNING_COLUMNS.contains(&column.name) => None,
                    Kind::U64 => Some(Order::Unsigned),
                    Kind::I32 | Kind::I64 => Some(Order::Signed),
                    // No pruning column is of these kinds.
                    Kind::F64 | Kind::Bool => None,
                    Kind::Str => None,
                },
                values: match column.kind {
                    Kind::I32 => Values::I32(Vec::with_capacity(ROW_GROUP)),
                    Kind::I64 | Kind::U64 => Values::I64(Vec::with_capacity(ROW_GROUP)),
                    Kind::F64 => Values::F64(Vec::with_capacity(ROW_GROUP)),
                    Kind::Bool => Values::Bool(Vec::with_capacity(ROW_GROUP)),
                    Kind::Str => Values::Str(StringColumn::default()),
                },
                defs: Vec::new(),
            })
            .collect();
        let file = TableFile {
            path: path.to_path_buf(),
            writer,
            schema: columns.to_vec(),
            kept: None,
        };
        Ok((file, buffers))
    }

    /// Writes one row group of `rows` rows from the buffers, all of the
    /// schema's columns in its order, and empties them.
    pub(crate) fn write_group<'b>(
        &mut self,
        buffers: impl IntoIterator<Item = &'b mut Buffer>,
        rows: usize,
    ) -> Result<(), Error> {
        let path = &self.path;
        let mut buffers: Vec<&mut Buffer> = buffers.into_iter().collect();
        // A table's own code fills the buffers: a wrong count or order is a
        // bug, reported as such rather than written.
        for (i, b) in buffers.iter().enumerate() {
            if b.index != i || b.rows() != rows {
                return Err(Error::Schema {
                    path: path.clone(),
                    what: format!(
                        "column {} (schema position {}) has {} rows at position {i} of a row group of {rows}",
                        b.column.name,
                        b.index,
                        b.rows()
                    ),
                });
            }
        }
        if rows == 0 {
            return Ok(());
        }
        if let Some(kept) = &mut self.kept {
            kept.add_group(&buffers, rows);
        }
        let err = |e| Error::parquet(path, "writing a row group", e);
        let mut group = self.writer.next_row_group().map_err(err)?;
        for b in &mut buffers {
            b.write(&mut group, rows).map_err(err)?;
        }
        group.close().map_err(err)?;
        Ok(())
    }

    /// Keeps a copy of `columns` (those of them in the file) of every row
    /// group written from now on, which [`TableFile::finish`] returns.
    pub(crate) fn keep(&mut self, columns: &[Column]) {
        self.kept = Some(KeptTable::new(&self.path, &self.schema, columns));
    }

    /// Writes the footer and syncs the file; returns what was kept.
    pub(crate) fn finish(self) -> Result<Option<KeptTable>, Error> {
        let path = self.path;
        let inner = self
            .writer
            .into_inner()
            .map_err(|e| Error::parquet(&path, "writing the footer", e))?;
        inner
            .into_inner()
            .map_err(|e| Error::io(&path, "cannot write", e.into_error()))?
            .sync_all()
            .map_err(|e| Error::io(&path, "cannot sync", e))?;
        Ok(self.kept)
    }
}

/// The Parquet key-value metadata key of a table's layout version (a
/// table without it is version 1).
pub const TABLE_VERSION_KEY: &str = "deepspan.table_version";

impl TableWriter {
    /// Creates (or truncates) `path` for a table of these columns.
    pub fn create(path: &Path, columns: &[Column]) -> Result<TableWriter, Error> {
        TableWriter::create_versioned(path, columns, None)
    }

    /// As [`TableWriter::create`], recording the table's layout `version`
    /// (key [`TABLE_VERSION_KEY`]) when there is one.
    pub fn create_versioned(
        path: &Path,
        columns: &[Column],
        version: Option<u32>,
    ) -> Result<TableWriter, Error> {
        let (file, buffers) = TableFile::create(path, columns, version)?;
        Ok(TableWriter {
            file,
            buffers,
            next: 0,
            rows_buffered: 0,
            rows: 0,
            misuse: None,
        })
    }

    /// Records a value that does not fit its column (a bug in the caller's
    /// column order): reported by the next [`TableWriter::end_row`], not
    /// panicked on. The values themselves cost no check beyond a match.
    #[cold]
    fn misuse(&mut self, column: usize, kind: &str, null: bool) {
        if self.misuse.is_some() {
            return;
        }
        let what = match self.buffers.get(column) {
            None => format!(
                "more values than the {} columns in a row",
                self.buffers.len()
            ),
            Some(b) if null => format!("null for the required column {}", b.column.name),
            Some(b) => format!(
                "a {kind} value for column {} of kind {:?}",
                b.column.name, b.column.kind
            ),
        };
        self.misuse = Some(what);
    }

    // The pushes run once per value, tens of millions of times a run: as
    // calls, moving the value in and the drop glue of the misuse path cost
    // more than the push itself, so they are always inlined.
    #[inline(always)]
    pub fn i32(&mut self, v: i32) {
        self.opt_i32(Some(v))
    }

    #[inline(always)]
    pub fn opt_i32(&mut self, v: Option<i32>) {
        let i = self.next;
        self.next += 1;
        if let Some(Buffer {
            column,
            values: Values::I32(vals),
            defs,
            ..
        }) = self.buffers.get_mut(i)
        {
            if column.nullable {
                defs.push(v.is_some() as i16);
            }
            match v {
                Some(v) => return vals.push(v),
                None if column.nullable => return,
                None => {}
            }
        }
        self.misuse(i, "i32", v.is_none());
    }

    #[inline(always)]
    pub fn i64(&mut self, v: i64) {
        self.opt_i64(Some(v))
    }

    #[inline(always)]
    pub fn opt_i64(&mut self, v: Option<i64>) {
        let i = self.next;
        self.next += 1;
        if let Some(Buffer {
            column,
            values: Values::I64(vals),
            defs,
            ..
        }) = self.buffers.get_mut(i)
        {
            if column.nullable {
                defs.push(v.is_some() as i16);
            }
            match v {
                Some(v) => return vals.push(v),
                None if column.nullable => return,
                None => {}
            }
        }
        self.misuse(i, "i64", v.is_none());
    }

    /// Nanoseconds and other unsigned values that fit in 63 bits are
    /// written as i64; larger ones (raw pointers in U64 columns) keep their
    /// bits.
    #[inline(always)]
    pub fn u64(&mut self, v: u64) {
        self.opt_i64(Some(v as i64))
    }

    #[inline(always)]
    pub fn opt_u64(&mut self, v: Option<u64>) {
        self.opt_i64(v.map(|v| v as i64))
    }

    #[inline(always)]
    pub fn f64(&mut self, v: f64) {
        let i = self.next;
        self.next += 1;
        if let Some(Buffer {
            values: Values::F64(vals),
            ..
        }) = self.buffers.get_mut(i)
        {
            return vals.push(v);
        }
        self.misuse(i, "f64", false);
    }

    #[inline(always)]
    pub fn bool(&mut self, v: bool) {
        let i = self.next;
        self.next += 1;
        if let Some(Buffer {
            values: Values::Bool(vals),
            ..
        }) = self.buffers.get_mut(i)
        {
            return vals.push(v);
        }
        self.misuse(i, "bool", false);
    }

    /// A string made for this row (copied when new to the row group).
    pub fn str(&mut self, v: &str) {
        self.opt_str(Some(v))
    }

    pub fn opt_str(&mut self, v: Option<&str>) {
        self.text(v.map(|v| move |c: &mut StringColumn| c.push_str(v)))
    }

    /// A string known at compile time: no copy.
    #[inline(always)]
    pub fn static_str(&mut self, v: &'static str) {
        self.text(Some(|c: &mut StringColumn| c.push_static(v.as_bytes())))
    }

    /// UTF-8 text in a shared buffer: callers cache repeated values such as
    /// thread names ([`interned`]), which the column then finds by address.
    #[inline(always)]
    pub fn bytes(&mut self, v: Option<&Bytes>) {
        self.text(v.map(|v| move |c: &mut StringColumn| c.push(v)))
    }

    /// The next value of a string column: `push` adds it, `None` is null.
    #[inline(always)]
    fn text(&mut self, push: Option<impl FnOnce(&mut StringColumn)>) {
        let i = self.next;
        self.next += 1;
        let null = push.is_none();
        if let Some(Buffer {
            column,
            values: Values::Str(vals),
            defs,
            ..
        }) = self.buffers.get_mut(i)
        {
            if column.nullable {
                defs.push(!null as i16);
            }
            match push {
                Some(push) => return push(vals),
                None if column.nullable => return,
                None => {}
            }
        }
        self.misuse(i, "string", null);
    }

    /// Ends the current row; every column must have had its value, of its
    /// kind.
    #[inline]
    pub fn end_row(&mut self) -> Result<(), Error> {
        // Once per row: the error cases are out of line, the row group
        // write too.
        if self.misuse.is_some() || self.next != self.buffers.len() {
            return Err(self.row_error());
        }
        self.next = 0;
        self.rows_buffered += 1;
        self.rows += 1;
        if self.rows_buffered >= ROW_GROUP {
            return self.flush();
        }
        Ok(())
    }

    /// What is wrong with the current row (see [`TableWriter::end_row`]).
    #[cold]
    #[inline(never)]
    fn row_error(&self) -> Error {
        let what = match &self.misuse {
            // Poisoned: the columns no longer line up.
            Some(what) => format!("row {}: {what}", self.rows),
            None => format!(
                "row {} has {} values for {} columns",
                self.rows,
                self.next,
                self.buffers.len()
            ),
        };
        Error::Schema {
            path: self.file.path.clone(),
            what,
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    #[inline(never)]
    fn flush(&mut self) -> Result<(), Error> {
        self.file
            .write_group(&mut self.buffers, self.rows_buffered)?;
        self.rows_buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and the file footer.
    pub fn finish(mut self) -> Result<u64, Error> {
        if let Some(what) = self.misuse.take() {
            return Err(Error::Schema {
                path: self.file.path.clone(),
                what,
            });
        }
        if self.next != 0 {
            return Err(Error::Schema {
                path: self.file.path.clone(),
                what: "the last row is incomplete".into(),
            });
        }
        self.flush()?;
        self.file.finish()?;
        Ok(self.rows)
    }
}

/// A value read back from a table.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    /// Unsigned 64-bit values (U64 columns).
    UInt(u64),
    F64(f64),
    Bool(bool),
    Str(String),
}

impl Cell {
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Cell::Int(v) => Some(*v),
            Cell::UInt(v) => i64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Cell::Int(v) => u64::try_from(*v).ok(),
            Cell::UInt(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Cell::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Cell::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::F64(v) => Some(*v),
            _ => None,
        }
    }
}

/// Reads the rows of a table for which `keep` is true, as `(column name,
/// value)` lists in column order.
pub fn read_rows(
    path: &Path,
    mut keep: impl FnMut(&[(String, Cell)]) -> bool,
) -> Result<Vec<Vec<(String, Cell)>>, Error> {
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| Error::parquet(path, "reading the footer", e))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| Error::parquet(path, "reading rows", e))?;
    let mut out = Vec::new();
    for row in rows {
        let row = row.map_err(|e| Error::parquet(path, "reading a row", e))?;
        let cells: Vec<(String, Cell)> = row
            .get_column_iter()
            .map(|(name, f)| (name.clone(), cell(f)))
            .collect();
        if keep(&cells) {
            out.push(cells);
        }
    }
    Ok(out)
}

fn cell(f: &Field) -> Cell {
    match f {
        Field::Null => Cell::Null,
        Field::Bool(b) => Cell::Bool(*b),
        Field::Byte(v) => Cell::Int(i64::from(*v)),
        Field::Short(v) => Cell::Int(i64::from(*v)),
        Field::Int(v) => Cell::Int(i64::from(*v)),
        Field::Long(v) => Cell::Int(*v),
        Field::UByte(v) => Cell::Int(i64::from(*v)),
        Field::UShort(v) => Cell::Int(i64::from(*v)),
        Field::UInt(v) => Cell::Int(i64::from(*v)),
        Field::ULong(v) => Cell::UInt(*v),
        Field::Float(v) => Cell::F64(f64::from(*v)),
        Field::Double(v) => Cell::F64(*v),
        Field::Str(s) => Cell::Str(s.clone()),
        other => Cell::Str(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_with_nulls_and_many_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let cols = [
            Column::new("a", Kind::I64),
            Column::nullable("b", Kind::Str),
            Column::new("c", Kind::U64),
            Column::nullable("d", Kind::I32),
            Column::new("e", Kind::Bool),
            Column::new("f", Kind::F64),
        ];
        let mut w = TableWriter::create(&path, &cols).unwrap();
        let n = ROW_GROUP as u64 + 10;
        for i in 0..n {
            w.i64(i as i64);
            w.opt_str((i % 2 == 0).then_some("x"));
            w.u64(u64::MAX - i);
            w.opt_i32((i % 3 == 0).then_some(i as i32));
            w.bool(i % 5 == 0);
            w.f64(i as f64 / 2.0);
            w.end_row().unwrap();
        }
        assert_eq!(w.finish().unwrap(), n);
        let rows = read_rows(&path, |r| r[0].1.as_i64().is_some_and(|a| a % 1000 == 0)).unwrap();
        assert_eq!(rows.len(), (n as usize).div_ceil(1000));
        let r = &rows[1];
        assert_eq!(r[0], ("a".to_string(), Cell::Int(1000)));
        assert_eq!(r[1].1, Cell::Str("x".into()));
        assert_eq!(r[2].1.as_u64(), Some(u64::MAX - 1000));
        assert_eq!(r[3].1, Cell::Null);
        assert_eq!(r[4].1, Cell::Bool(true));
        assert_eq!(r[5].1.as_f64(), Some(500.0));
    }

    #[test]
    fn a_versioned_table_says_its_version_in_the_file_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let cols = [Column::new("a", Kind::I64)];
        let version_of = |name: &str, version: Option<u32>| {
            let path = dir.path().join(name);
            let mut w = TableWriter::create_versioned(&path, &cols, version).unwrap();
            w.i64(1);
            w.end_row().unwrap();
            w.finish().unwrap();
            let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
            let kv = reader
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .cloned();
            kv.unwrap_or_default()
                .into_iter()
                .find(|k| k.key == TABLE_VERSION_KEY)
                .and_then(|k| k.value)
        };
        assert_eq!(version_of("v2.parquet", Some(2)).as_deref(), Some("2"));
        assert_eq!(version_of("v1.parquet", None), None);
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut w = TableWriter::create(&path, &[Column::new("a", Kind::I64)]).unwrap();
        w.opt_i64(None);
        assert!(w.end_row().is_err());
        assert!(w.end_row().is_err(), "a misused writer stays failed");
        let mut w = TableWriter::create(&path, &[Column::new("a", Kind::I64)]).unwrap();
        w.str("x");
        assert!(w.end_row().is_err());
        let mut w = TableWriter::create(&path, &[Column::new("a", Kind::I64)]).unwrap();
        assert!(w.end_row().is_err());
        let mut w = TableWriter::create(&path, &[Column::new("a", Kind::I64)]).unwrap();
        w.i64(1);
        w.i64(2);
        assert!(w.end_row().is_err());
        assert!(w.finish().is_err());
    }

    /// The string columns are encoded here (src/strings.rs): every way a
    /// value reaches them, read back by the parquet crate with its page
    /// index, row group by row group.
    #[test]
    fn string_columns_round_trip() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::file::serialized_reader::ReadOptionsBuilder;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let cols = [
            Column::new("i", Kind::I64),
            // Shared buffers, aliases of equal bytes, static strings.
            Column::new("shared", Kind::Str),
            // Null in whole row groups, one value in others.
            Column::nullable("sparse", Kind::Str),
            // Distinct per row, over a megabyte per row group: written by
            // the parquet crate's writer instead.
            Column::new("distinct", Kind::Str),
            Column::nullable("made", Kind::Str),
        ];
        let expected = |i: usize| {
            let shared = format!("value {}", (i / 3) % 300);
            let group = i / ROW_GROUP;
            let sparse = (group % 2 == 1 && i.is_multiple_of(7)).then(|| "only".to_string());
            let distinct = format!("{i:0>80}");
            let made = (!i.is_multiple_of(4)).then(|| ["", "a", "bc"][i % 3].to_string());
            (shared, sparse, distinct, made)
        };
        let kept: Vec<Bytes> = (0..300)
            .map(|k| interned(format!("value {k}").as_bytes()))
            .collect();
        let mut w = TableWriter::create(&path, &cols).unwrap();
        let rows = 3 * ROW_GROUP + 123;
        for i in 0..rows {
            let (shared, sparse, distinct, made) = expected(i);
            w.i64(i as i64);
            match i % 3 {
                0 => w.bytes(Some(&kept[(i / 3) % 300])),
                1 => w.bytes(Some(&Bytes::from(shared.into_bytes()))),
                _ => w.str(&shared),
            }
            match sparse {
                Some(_) => w.static_str("only"),
                None => w.bytes(None),
            }
            w.str(&distinct);
            w.opt_str(made.as_deref());
            w.end_row().unwrap();
        }
        assert_eq!(w.finish().unwrap(), rows as u64);

        let got = read_rows(&path, |_| true).unwrap();
        assert_eq!(got.len(), rows);
        for (i, row) in got.iter().enumerate() {
            let (shared, sparse, distinct, made) = expected(i);
            let text = |s: Option<String>| s.map_or(Cell::Null, Cell::Str);
            assert_eq!(row[0].1, Cell::Int(i as i64));
            assert_eq!(row[1].1, Cell::Str(shared), "row {i}");
            assert_eq!(row[2].1, text(sparse), "row {i}");
            assert_eq!(row[3].1, Cell::Str(distinct), "row {i}");
            assert_eq!(row[4].1, text(made), "row {i}");
        }

        let options = ReadOptionsBuilder::new().with_page_index().build();
        let reader =
            SerializedFileReader::new_with_options(File::open(&path).unwrap(), options).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 4);
        assert!(meta.page_index().is_some(), "an offset index");
        for (g, group) in meta.row_groups().iter().enumerate() {
            let shared = group.column(1);
            assert!(shared.dictionary_page_offset().is_some());
            let pages = meta.page_index_for_row_group(g);
            let page = &pages.page_locations(1).expect("the column's pages")[0];
            assert_eq!(page.offset, shared.data_page_offset());
            assert_eq!(page.first_row_index, 0);
            // Each row group's dictionary holds each value once.
            let values = reader
                .get_row_group(g)
                .unwrap()
                .get_column_page_reader(1)
                .unwrap()
                .next()
                .unwrap()
                .unwrap();
            let first = g * ROW_GROUP;
            let distinct: HashSet<String> = (first..rows.min(first + ROW_GROUP))
                .map(|i| expected(i).0)
                .collect();
            assert_eq!(
                values.num_values() as usize,
                distinct.len(),
                "row group {g}"
            );
        }
    }

    /// 64-bit columns are encoded here too (src/delta.rs): nulls, the
    /// extremes, unsigned values, and the min/max that pruning columns keep.
    #[test]
    fn int64_columns_round_trip_with_statistics() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::file::statistics::Statistics;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let cols = [
            Column::nullable("start_ns", Kind::I64),
            Column::new("raw", Kind::U64),
            Column::nullable("other", Kind::I64),
        ];
        let start =
            |i: usize| (!i.is_multiple_of(3)).then(|| 1_000_000_000 + (i as i64) * 977 - 5_000);
        let raw = |i: usize| {
            if i.is_multiple_of(2) {
                u64::MAX - i as u64
            } else {
                i as u64
            }
        };
        let other = |i: usize| match i % 4 {
            0 => None,
            1 => Some(i64::MIN + i as i64),
            _ => Some(i64::MAX - i as i64),
        };
        let rows = ROW_GROUP + 300;
        let mut w = TableWriter::create(&path, &cols).unwrap();
        for i in 0..rows {
            w.opt_i64(start(i));
            w.u64(raw(i));
            w.opt_i64(other(i));
            w.end_row().unwrap();
        }
        w.finish().unwrap();

        let got = read_rows(&path, |_| true).unwrap();
        assert_eq!(got.len(), rows);
        for (i, row) in got.iter().enumerate() {
            assert_eq!(row[0].1, start(i).map_or(Cell::Null, Cell::Int), "row {i}");
            assert_eq!(row[1].1.as_u64(), Some(raw(i)), "row {i}");
            assert_eq!(row[2].1, other(i).map_or(Cell::Null, Cell::Int), "row {i}");
        }
        let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        for (g, group) in reader.metadata().row_groups().iter().enumerate() {
            let first = g * ROW_GROUP;
            let range = first..rows.min(first + ROW_GROUP);
            let present: Vec<i64> = range.clone().filter_map(start).collect();
            match group.column(0).statistics() {
                Some(Statistics::Int64(s)) => {
                    assert_eq!(s.min_opt(), present.iter().min(), "row group {g}");
                    assert_eq!(s.max_opt(), present.iter().max(), "row group {g}");
                    assert_eq!(
                        s.null_count_opt(),
                        Some((range.len() - present.len()) as u64)
                    );
                }
                other => panic!("start_ns statistics: {other:?}"),
            }
            assert!(
                group.column(1).statistics().is_none(),
                "only pruning columns keep them"
            );
        }
    }
}
