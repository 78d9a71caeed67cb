//! The analysis tables read back as typed rows.
//!
//! Each table is declared once, in `tables.rs`, with [`table!`]: a struct
//! whose fields are its columns. The declaration gives the writers the
//! table's schema (the `*_COLUMNS` list that every file is created with)
//! and gives readers the same struct, one value per row. A column added,
//! renamed or retyped changes both sides, and a reader that used it no
//! longer compiles.
//!
//! Reading a file checks it against the struct once: a required column the
//! file lacks, or a column of another kind, is an error naming the file and
//! the column. A nullable column the file lacks reads as null: that is how
//! an older layout of a table reads (a `diagnoses` table of layout 1 has no
//! `root_*` columns). Columns the struct does not know are not decoded.
//!
//! Each column the struct reads is decoded a batch at a time through
//! Parquet's column readers, and the rows are put together from the
//! batches: Parquet's row API would make a value object per cell, which
//! was most of the time `deepspan export` spent.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use parquet::basic::{ConvertedType, IntType, LogicalType, Type as Physical};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DataType, DoubleType, Int32Type, Int64Type,
};
use parquet::file::reader::{FileReader, RowGroupReader, SerializedFileReader};
use parquet::schema::types::ColumnDescriptor;

use crate::kept::{KeptColumn, KeptTable};
use crate::table::{Column, Kind};
use crate::Error;

/// One cell of a column, as decoded: borrowed from its batch.
#[derive(Clone, Copy, Debug)]
pub enum Cell<'a> {
    Null,
    Bool(bool),
    I32(i32),
    /// An INT64 column's value, signed or not (`Kind::U64` reads it as
    /// the same 64 bits).
    I64(i64),
    F64(f64),
    Bytes(&'a [u8]),
}

/// A Rust type a column is read into: its column kind, whether it may be
/// null, and how a decoded cell becomes it. The file's columns are checked
/// against the kinds before any row is read, so a cell is always of its
/// column's kind; it may still be a null, or text that is not UTF-8.
pub trait CellType: Sized {
    const KIND: Kind;
    const NULLABLE: bool = false;
    /// The value of one cell; `None` when it does not fit (a null for a
    /// type that cannot be null, text that is not UTF-8).
    fn from_cell(cell: Cell<'_>) -> Option<Self>;
}

impl CellType for i32 {
    const KIND: Kind = Kind::I32;
    fn from_cell(cell: Cell<'_>) -> Option<i32> {
        match cell {
            Cell::I32(v) => Some(v),
            _ => None,
        }
    }
}

impl CellType for i64 {
    const KIND: Kind = Kind::I64;
    fn from_cell(cell: Cell<'_>) -> Option<i64> {
        match cell {
            Cell::I64(v) => Some(v),
            _ => None,
        }
    }
}

impl CellType for u64 {
    const KIND: Kind = Kind::U64;
    fn from_cell(cell: Cell<'_>) -> Option<u64> {
        match cell {
            // The column holds the unsigned value's bits.
            Cell::I64(v) => Some(v as u64),
            _ => None,
        }
    }
}

impl CellType for f64 {
    const KIND: Kind = Kind::F64;
    fn from_cell(cell: Cell<'_>) -> Option<f64> {
        match cell {
            Cell::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl CellType for bool {
    const KIND: Kind = Kind::Bool;
    fn from_cell(cell: Cell<'_>) -> Option<bool> {
        match cell {
            Cell::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl CellType for String {
    const KIND: Kind = Kind::Str;
    fn from_cell(cell: Cell<'_>) -> Option<String> {
        match cell {
            Cell::Bytes(b) => std::str::from_utf8(b).ok().map(str::to_owned),
            _ => None,
        }
    }
}

impl<T: CellType> CellType for Option<T> {
    const KIND: Kind = T::KIND;
    const NULLABLE: bool = true;
    fn from_cell(cell: Cell<'_>) -> Option<Option<T>> {
        match cell {
            Cell::Null => Some(None),
            other => T::from_cell(other).map(Some),
        }
    }
}

/// A table's row, declared with [`table!`].
pub trait TableRow: Sized {
    /// The table's schema, in file order.
    const COLUMNS: &'static [Column];
    /// A row from its cells: `cells` gives the next row's cell of each
    /// column of [`TableRow::COLUMNS`], in that order. `Err` names the
    /// first column whose cell does not fit.
    fn from_cells(cells: &mut RowCells<'_>) -> Result<Self, CellError>;
}

/// Why a cell could not be read as its column's type.
#[derive(Debug)]
pub struct CellError {
    pub column: &'static str,
    pub found: String,
}

/// The value of the next cell (see [`TableRow::from_cells`]).
#[doc(hidden)]
pub fn take_cell<T: CellType>(
    cells: &mut RowCells<'_>,
    column: &'static str,
) -> Result<T, CellError> {
    let cell = cells.next();
    T::from_cell(cell).ok_or_else(|| CellError {
        column,
        found: match cell {
            Cell::Null => "null".to_string(),
            Cell::Bytes(b) => format!("{} bytes that are not UTF-8", b.len()),
            other => format!("{other:?}"),
        },
    })
}

/// Declares a table: its row struct, whose fields are its columns in file
/// order, and the schema constant derived from it. The field types are
/// [`CellType`]s; `Option` makes a column nullable.
macro_rules! table {
    (
        $(#[$doc:meta])*
        pub struct $row:ident, schema $columns:ident {
            $( $(#[$field_doc:meta])* $name:ident : $ty:ty ),* $(,)?
        }
    ) => {
        /// The schema of the table whose rows are
        #[doc = concat!("[`", stringify!($row), "`].")]
        pub const $columns: &[$crate::table::Column] = &[$(
            $crate::table::Column {
                name: stringify!($name),
                kind: <$ty as $crate::rows::CellType>::KIND,
                nullable: <$ty as $crate::rows::CellType>::NULLABLE,
            }
        ),*];

        $crate::table_view! {
            $(#[$doc])*
            pub struct $row of $columns {
                $( $(#[$field_doc])* $name: $ty, )*
            }
        }
    };
}
pub(crate) use table;

/// Declares some columns of a table as a row struct of their own, for a
/// reader that needs only those: a file is then decoded only in them.
/// Each field must be a column of `$columns` (a table's `*_COLUMNS`) with
/// the same name, kind and nullability, or the crate does not compile.
///
/// ```ignore
/// deepspan_store::table_view! {
///     /// What export reads of a system call.
///     pub struct CallTimes of deepspan_store::tables::SYSCALLS_COLUMNS {
///         tid: i32,
///         start_ns: i64,
///         end_ns: i64,
///     }
/// }
/// ```
#[macro_export]
macro_rules! table_view {
    (
        $(#[$doc:meta])*
        pub struct $row:ident of $columns:path {
            $( $(#[$field_doc:meta])* $name:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $row {
            $( $(#[$field_doc])* pub $name: $ty, )*
        }

        impl $crate::rows::TableRow for $row {
            const COLUMNS: &'static [$crate::table::Column] = &[$(
                $crate::table::Column {
                    name: stringify!($name),
                    kind: <$ty as $crate::rows::CellType>::KIND,
                    nullable: <$ty as $crate::rows::CellType>::NULLABLE,
                }
            ),*];

            fn from_cells(
                cells: &mut $crate::rows::RowCells<'_>,
            ) -> Result<$row, $crate::rows::CellError> {
                Ok($row {
                    $( $name: $crate::rows::take_cell(cells, stringify!($name))?, )*
                })
            }
        }

        const _: () = assert!(
            $crate::rows::columns_of(
                <$row as $crate::rows::TableRow>::COLUMNS,
                $columns,
            ),
            concat!(stringify!($row), " has a field that is not a column of ", stringify!($columns)),
        );
    };
}

/// Whether every column of `view` is a column of `table`, with the same
/// kind and nullability (checked at compile time by [`table_view!`]).
#[doc(hidden)]
pub const fn columns_of(view: &[Column], table: &[Column]) -> bool {
    let mut i = 0;
    while i < view.len() {
        let mut found = false;
        let mut j = 0;
        while j < table.len() {
            let (v, t) = (&view[i], &table[j]);
            if same_text(v.name, t.name) && v.kind as u8 == t.kind as u8 && v.nullable == t.nullable
            {
                found = true;
            }
            j += 1;
        }
        if !found {
            return false;
        }
        i += 1;
    }
    true
}

const fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Rows decoded at a time: each column is read this many values at once
/// through Parquet's column readers (not its row API, which makes a value
/// object per cell).
const BATCH: usize = 4096;

/// Calls `each` with every row of the table at `path`, in file order,
/// without holding the table in memory.
pub fn for_each_row<R: TableRow>(path: &Path, each: impl FnMut(R)) -> Result<(), Error> {
    let every_row = 0..u64::MAX;
    for_each_row_in(path, std::slice::from_ref(&every_row), each)
}

/// Calls `each` with the rows of the table at `path` whose numbers (from
/// 0, in file order) are in `rows`, in file order, each once. Row groups
/// outside `rows` are not read, and the rows of a group before a wanted
/// one are skipped by Parquet's column readers without being made into
/// rows: reading one request's pieces out of a table of every request's
/// costs about its own rows, not the table's. Ranges past the table's
/// end are cut at it.
pub fn for_each_row_in<R: TableRow>(
    path: &Path,
    rows: &[Range<u64>],
    mut each: impl FnMut(R),
) -> Result<(), Error> {
    let wanted = merged(rows);
    let reader = open(path)?;
    let sources = column_sources::<R>(path, &reader)?;
    let mut group_start = 0u64;
    for group in 0..reader.num_row_groups() {
        let group_rows = u64::try_from(reader.metadata().row_group(group).num_rows()).unwrap_or(0);
        let group_range = group_start..group_start + group_rows;
        let first = group_start;
        group_start = group_range.end;
        let mut parts = wanted
            .iter()
            .map(|r| r.start.max(group_range.start)..r.end.min(group_range.end))
            .filter(|r| r.start < r.end)
            .peekable();
        if parts.peek().is_none() {
            continue;
        }
        let group = reader
            .get_row_group(group)
            .map_err(|e| Error::parquet(path, "reading a row group", e))?;
        let mut columns = sources
            .iter()
            .map(|source| {
                source
                    .map(|i| Batch::open(path, group.as_ref(), i))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        // A table of only missing nullable columns has no rows to give.
        if columns.iter().all(Option::is_none) {
            continue;
        }
        let mut at = first;
        for part in parts {
            for column in columns.iter_mut().flatten() {
                column.skip(path, (part.start - at) as usize)?;
            }
            at = part.start;
            while at < part.end {
                let mut buffered = None;
                for column in columns.iter_mut().flatten() {
                    if column.buffered() == 0 {
                        column.fill(path)?;
                    }
                    if *buffered.get_or_insert(column.buffered()) != column.buffered() {
                        return Err(Error::Schema {
                            path: path.to_path_buf(),
                            what: format!("row {at}: columns of one row group differ in length"),
                        });
                    }
                }
                let take = buffered.unwrap_or(0).min((part.end - at) as usize);
                if take == 0 {
                    return Err(Error::Schema {
                        path: path.to_path_buf(),
                        what: format!(
                            "row {at}: the row group ends before the {group_rows} rows its \
                             footer gives"
                        ),
                    });
                }
                for _ in 0..take {
                    let mut cells = RowCells {
                        from: CellSource::File(&mut columns),
                        next: 0,
                    };
                    let row = R::from_cells(&mut cells).map_err(|e| cell_error(path, at, e))?;
                    each(row);
                    at += 1;
                }
            }
        }
    }
    Ok(())
}

/// The runs of equal values of the text column `column` of the table at
/// `path`: each run's value and its rows, in file order (a value written
/// in two places is two runs). A table written one key after another (the
/// `critical_path` table, request by request) reads back as where each
/// key's rows are, for [`for_each_row_in`], from that one column.
pub fn text_runs(path: &Path, column: &str) -> Result<Vec<(String, Range<u64>)>, Error> {
    let reader = open(path)?;
    let schema = reader.metadata().file_metadata().schema_descr();
    let index = schema
        .columns()
        .iter()
        .position(|c| c.path().parts() == [column])
        .ok_or_else(|| Error::Schema {
            path: path.to_path_buf(),
            what: format!("no column {column:?}"),
        })?;
    if kind_in_file(schema.column(index).as_ref()) != Some(Kind::Str) {
        return Err(Error::Schema {
            path: path.to_path_buf(),
            what: format!("column {column:?} does not hold text"),
        });
    }
    let mut runs: Vec<(String, Range<u64>)> = Vec::new();
    let mut row = 0u64;
    for group in 0..reader.num_row_groups() {
        let group = reader
            .get_row_group(group)
            .map_err(|e| Error::parquet(path, "reading a row group", e))?;
        let mut batch = Batch::open(path, group.as_ref(), index)?;
        while batch.fill(path)? > 0 {
            for _ in 0..batch.rows {
                let bad = |found: &str| Error::Schema {
                    path: path.to_path_buf(),
                    what: format!("row {row}: column {column:?} holds {found}, not text"),
                };
                let Cell::Bytes(value) = batch.next() else {
                    return Err(bad("null"));
                };
                match runs.last_mut() {
                    Some((last, rows)) if last.as_bytes() == value && rows.end == row => {
                        rows.end += 1
                    }
                    _ => {
                        let text = std::str::from_utf8(value)
                            .map_err(|_| bad("bytes that are not UTF-8"))?;
                        runs.push((text.to_string(), row..row + 1));
                    }
                }
                row += 1;
            }
        }
    }
    Ok(runs)
}

/// `rows` sorted, with overlapping and touching ranges joined.
fn merged(rows: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = rows.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// A cell that does not fit its row type's field, as an error.
fn cell_error(path: &Path, row: u64, e: CellError) -> Error {
    Error::Schema {
        path: path.to_path_buf(),
        what: format!(
            "row {row}: column {:?} holds {}, not a value of its type",
            e.column, e.found
        ),
    }
}

impl KeptTable {
    /// Calls `each` with every row of the table, in file order: the rows
    /// [`for_each_row`] reads from its file, with the same checks.
    pub fn for_each_row<R: TableRow>(&self, mut each: impl FnMut(R)) -> Result<(), Error> {
        let sources = R::COLUMNS
            .iter()
            .map(|column| {
                let found = self.schema.iter().position(|c| c.name == column.name);
                match found.map(|i| (i, self.schema[i])) {
                    None if column.nullable => Ok(None),
                    None => Err(format!("no column {:?} kept", column.name)),
                    Some((i, kept)) if kept.kind == column.kind => Ok(Some(i)),
                    Some((_, kept)) => Err(format!(
                        "column {:?} holds {:?} values, not {:?}",
                        column.name, kept.kind, column.kind
                    )),
                }
            })
            .collect::<Result<Vec<_>, String>>()
            .map_err(|what| Error::Schema {
                path: self.path.clone(),
                what,
            })?;
        let mut n = 0u64;
        for group in &self.groups {
            let columns: Vec<Option<&KeptColumn>> = sources
                .iter()
                .map(|s| s.and_then(|i| group.columns.get(i)))
                .collect();
            let mut next_values = vec![0usize; columns.len()];
            for row in 0..group.rows {
                let mut cells = RowCells {
                    from: CellSource::Kept {
                        columns: &columns,
                        row,
                        next_values: &mut next_values,
                    },
                    next: 0,
                };
                let r = R::from_cells(&mut cells).map_err(|e| cell_error(&self.path, n, e))?;
                each(r);
                n += 1;
            }
        }
        Ok(())
    }
}

/// The rows of the table at `path` for which `keep` is true, in file
/// order.
pub fn read_table<R: TableRow>(
    path: &Path,
    mut keep: impl FnMut(&R) -> bool,
) -> Result<Vec<R>, Error> {
    let mut kept = Vec::new();
    for_each_row(path, |row: R| {
        if keep(&row) {
            kept.push(row);
        }
    })?;
    Ok(kept)
}

fn open(path: &Path) -> Result<SerializedFileReader<File>, Error> {
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    SerializedFileReader::new(file).map_err(|e| Error::parquet(path, "reading the footer", e))
}

/// For each column of `R`, the index of the file's column it is read from
/// (`None`: a nullable column the file lacks, read as null). Checks the
/// file's columns against `R`'s kinds.
fn column_sources<R: TableRow>(
    path: &Path,
    reader: &SerializedFileReader<File>,
) -> Result<Vec<Option<usize>>, Error> {
    let schema = reader.metadata().file_metadata().schema_descr();
    let bad = |what: String| Error::Schema {
        path: path.to_path_buf(),
        what,
    };
    R::COLUMNS
        .iter()
        .map(|column| {
            let found = schema
                .columns()
                .iter()
                .position(|c| c.path().parts().len() == 1 && c.path().parts()[0] == column.name);
            let Some(i) = found else {
                return if column.nullable {
                    Ok(None)
                } else {
                    Err(bad(format!(
                        "no column {:?}: not a table of this layout (written by another deepspan?)",
                        column.name
                    )))
                };
            };
            match kind_in_file(schema.column(i).as_ref()) {
                Some(kind) if kind == column.kind => Ok(Some(i)),
                in_file => Err(bad(format!(
                    "column {:?} holds {} values, not {:?} (written by another deepspan?)",
                    column.name,
                    in_file.map_or_else(
                        || format!("{:?}", schema.column(i).physical_type()),
                        |k| format!("{k:?}")
                    ),
                    column.kind
                ))),
            }
        })
        .collect()
}

/// The kind a file's column holds, as `table.rs` writes each kind.
fn kind_in_file(column: &ColumnDescriptor) -> Option<Kind> {
    let unsigned = matches!(
        column.logical_type_ref(),
        Some(LogicalType::Integer(IntType {
            is_signed: false,
            ..
        }))
    ) || column.converted_type() == ConvertedType::UINT_64;
    Some(match column.physical_type() {
        Physical::INT32 => Kind::I32,
        Physical::INT64 if unsigned => Kind::U64,
        Physical::INT64 => Kind::I64,
        Physical::DOUBLE => Kind::F64,
        Physical::BOOLEAN => Kind::Bool,
        Physical::BYTE_ARRAY => Kind::Str,
        _ => return None,
    })
}

/// One column of a row group, read [`BATCH`] values at a time.
struct Batch {
    values: Values,
    /// Definition levels of a nullable column (0: null); empty otherwise.
    levels: Vec<i16>,
    nullable: bool,
    /// Rows decoded by the last [`Batch::fill`].
    rows: usize,
    /// The next row's position in `levels` and in `values`.
    next_row: usize,
    next_value: usize,
}

/// A column's reader and its decoded values, by physical type.
enum Values {
    Bool(ColumnReaderImpl<BoolType>, Vec<bool>),
    I32(ColumnReaderImpl<Int32Type>, Vec<i32>),
    I64(ColumnReaderImpl<Int64Type>, Vec<i64>),
    F64(ColumnReaderImpl<DoubleType>, Vec<f64>),
    Bytes(ColumnReaderImpl<ByteArrayType>, Vec<ByteArray>),
}

impl Batch {
    fn open(path: &Path, group: &dyn RowGroupReader, i: usize) -> Result<Batch, Error> {
        let nullable = group.metadata().column(i).column_descr().max_def_level() > 0;
        let reader = group
            .get_column_reader(i)
            .map_err(|e| Error::parquet(path, "reading a column", e))?;
        let values = match reader {
            ColumnReader::BoolColumnReader(r) => Values::Bool(r, Vec::new()),
            ColumnReader::Int32ColumnReader(r) => Values::I32(r, Vec::new()),
            ColumnReader::Int64ColumnReader(r) => Values::I64(r, Vec::new()),
            ColumnReader::DoubleColumnReader(r) => Values::F64(r, Vec::new()),
            ColumnReader::ByteArrayColumnReader(r) => Values::Bytes(r, Vec::new()),
            // column_sources let only the kinds above through.
            _ => unreachable!("a column of a kind deepspan does not write"),
        };
        Ok(Batch {
            values,
            levels: Vec::new(),
            nullable,
            rows: 0,
            next_row: 0,
            next_value: 0,
        })
    }

    /// Rows decoded and not yet taken.
    fn buffered(&self) -> usize {
        self.rows - self.next_row
    }

    /// Passes over the next `n` rows: those decoded already, then rows
    /// the column reader skips (whole pages without decompressing them).
    fn skip(&mut self, path: &Path, n: usize) -> Result<(), Error> {
        let decoded = n.min(self.buffered());
        for _ in 0..decoded {
            self.next();
        }
        let rest = n - decoded;
        if rest == 0 {
            return Ok(());
        }
        let skipped = match &mut self.values {
            Values::Bool(r, _) => r.skip_records(rest),
            Values::I32(r, _) => r.skip_records(rest),
            Values::I64(r, _) => r.skip_records(rest),
            Values::F64(r, _) => r.skip_records(rest),
            Values::Bytes(r, _) => r.skip_records(rest),
        }
        .map_err(|e| Error::parquet(path, "skipping rows of a column", e))?;
        if skipped != rest {
            return Err(Error::Schema {
                path: path.to_path_buf(),
                what: format!("a column chunk ends {} rows early", rest - skipped),
            });
        }
        Ok(())
    }

    /// Decodes the next rows of the column; how many (0 at its end).
    fn fill(&mut self, path: &Path) -> Result<usize, Error> {
        fn read<T: DataType>(
            reader: &mut ColumnReaderImpl<T>,
            values: &mut Vec<T::T>,
            levels: Option<&mut Vec<i16>>,
        ) -> parquet::errors::Result<usize> {
            values.clear();
            reader
                .read_records(BATCH, levels, None, values)
                .map(|(rows, _, _)| rows)
        }
        self.levels.clear();
        let levels = self.nullable.then_some(&mut self.levels);
        let rows = match &mut self.values {
            Values::Bool(r, v) => read(r, v, levels),
            Values::I32(r, v) => read(r, v, levels),
            Values::I64(r, v) => read(r, v, levels),
            Values::F64(r, v) => read(r, v, levels),
            Values::Bytes(r, v) => read(r, v, levels),
        }
        .map_err(|e| Error::parquet(path, "decoding a column", e))?;
        self.rows = rows;
        self.next_row = 0;
        self.next_value = 0;
        Ok(rows)
    }

    /// The next row's cell.
    fn next(&mut self) -> Cell<'_> {
        let row = self.next_row;
        self.next_row += 1;
        if self.nullable && self.levels.get(row).is_none_or(|&level| level == 0) {
            return Cell::Null;
        }
        let i = self.next_value;
        self.next_value += 1;
        let cell = match &self.values {
            Values::Bool(_, v) => v.get(i).map(|&v| Cell::Bool(v)),
            Values::I32(_, v) => v.get(i).map(|&v| Cell::I32(v)),
            Values::I64(_, v) => v.get(i).map(|&v| Cell::I64(v)),
            Values::F64(_, v) => v.get(i).map(|&v| Cell::F64(v)),
            Values::Bytes(_, v) => v.get(i).map(|v| Cell::Bytes(v.data())),
        };
        cell.unwrap_or(Cell::Null)
    }
}

/// One row's cells, column after column (see [`TableRow::from_cells`]).
pub struct RowCells<'a> {
    from: CellSource<'a>,
    next: usize,
}

/// Where a row's cells come from.
enum CellSource<'a> {
    /// Batches decoded from the file.
    File(&'a mut [Option<Batch>]),
    /// A row group kept in memory; `next_values`: each column's next
    /// non-null value.
    Kept {
        columns: &'a [Option<&'a KeptColumn>],
        row: usize,
        next_values: &'a mut [usize],
    },
}

impl RowCells<'_> {
    fn next(&mut self) -> Cell<'_> {
        let column = self.next;
        self.next += 1;
        // A nullable column the file lacks reads as null.
        match &mut self.from {
            CellSource::File(columns) => match columns.get_mut(column) {
                Some(Some(batch)) => batch.next(),
                _ => Cell::Null,
            },
            CellSource::Kept {
                columns,
                row,
                next_values,
            } => match (columns.get(column), next_values.get_mut(column)) {
                (Some(Some(kept)), Some(next_value)) => kept.cell(*row, next_value),
                _ => Cell::Null,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::TableWriter;

    table! {
        /// A table of every kind of column.
        pub struct SampleRow, schema SAMPLE_COLUMNS {
            /// An id.
            id: i32,
            big: u64,
            at: i64,
            label: Option<String>,
            share: f64,
            flag: bool,
            extra: Option<i64>,
        }
    }

    fn write(path: &Path, columns: &[Column], rows: &[SampleRow]) {
        let mut w = TableWriter::create(path, columns).unwrap();
        for r in rows {
            for c in columns {
                match c.name {
                    "id" => w.i32(r.id),
                    "big" => w.u64(r.big),
                    "at" => w.i64(r.at),
                    "label" => w.opt_str(r.label.as_deref()),
                    "share" => w.f64(r.share),
                    "flag" => w.bool(r.flag),
                    "extra" => w.opt_i64(r.extra),
                    "unknown" => w.str("ignored"),
                    other => panic!("no column {other}"),
                }
            }
            w.end_row().unwrap();
        }
        w.finish().unwrap();
    }

    fn sample(i: i32) -> SampleRow {
        SampleRow {
            id: i,
            big: u64::MAX - i as u64,
            at: -(i as i64),
            label: (i % 2 == 0).then(|| format!("l{i}")),
            share: f64::from(i) / 4.0,
            flag: i % 3 == 0,
            extra: (i % 5 == 0).then_some(i64::from(i) * 7),
        }
    }

    crate::table_view! {
        /// Two columns of the sample, in another order.
        pub struct SampleIds of SAMPLE_COLUMNS {
            label: Option<String>,
            id: i32,
        }
    }

    #[test]
    fn a_view_reads_only_its_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let rows: Vec<SampleRow> = (0..9).map(sample).collect();
        write(&path, SAMPLE_COLUMNS, &rows);
        let back: Vec<SampleIds> = read_table(&path, |_| true).unwrap();
        let expected: Vec<SampleIds> = rows
            .iter()
            .map(|r| SampleIds {
                label: r.label.clone(),
                id: r.id,
            })
            .collect();
        assert_eq!(back, expected);
        let retyped = [Column::nullable("id", Kind::I32)];
        assert!(columns_of(&SAMPLE_COLUMNS[..2], SAMPLE_COLUMNS));
        assert!(!columns_of(&retyped, SAMPLE_COLUMNS));
        assert!(!columns_of(
            &[Column::new("idx", Kind::I32)],
            SAMPLE_COLUMNS
        ));
    }

    #[test]
    fn the_schema_is_the_struct_in_order() {
        let names: Vec<_> = SAMPLE_COLUMNS.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            ["id", "big", "at", "label", "share", "flag", "extra"]
        );
        assert_eq!(SAMPLE_COLUMNS[1].kind, Kind::U64);
        assert!(!SAMPLE_COLUMNS[0].nullable);
        assert!(SAMPLE_COLUMNS[3].nullable);
        assert_eq!(SAMPLE_COLUMNS[3].kind, Kind::Str);
    }

    #[test]
    fn rows_read_back_as_written_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let rows: Vec<SampleRow> = (0..crate::table::ROW_GROUP as i32 + 7)
            .map(sample)
            .collect();
        write(&path, SAMPLE_COLUMNS, &rows);
        let back: Vec<SampleRow> = read_table(&path, |_| true).unwrap();
        assert_eq!(back, rows);
        let odd: Vec<SampleRow> = read_table(&path, |r: &SampleRow| r.id % 2 == 1).unwrap();
        assert_eq!(odd.len(), rows.len() / 2);
        assert!(odd.iter().all(|r| r.label.is_none()));
    }

    #[test]
    fn rows_in_ranges_are_those_rows_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let group = crate::table::ROW_GROUP as u64;
        let rows: Vec<SampleRow> = (0..3 * group as i32 + 7).map(sample).collect();
        write(&path, SAMPLE_COLUMNS, &rows);
        let ranges = [
            // Unsorted, overlapping, across a group's end, within the last
            // group, past the table's end, and empty.
            group - 2..group + 3,
            3..5,
            4..9,
            2 * group + 1..2 * group + 2,
            3 * group + 5..u64::MAX,
            10..10,
        ];
        let mut back: Vec<SampleRow> = Vec::new();
        for_each_row_in(&path, &ranges, |r: SampleRow| back.push(r)).unwrap();
        let expected: Vec<SampleRow> = rows
            .iter()
            .enumerate()
            .filter(|(i, _)| ranges.iter().any(|r| r.contains(&(*i as u64))))
            .map(|(_, r)| r.clone())
            .collect();
        assert_eq!(back, expected);
        // A view of fewer columns skips the same rows.
        let mut ids = Vec::new();
        for_each_row_in(&path, &ranges, |r: SampleIds| ids.push(r.id)).unwrap();
        let expected_ids: Vec<i32> = expected.iter().map(|r| r.id).collect();
        assert_eq!(ids, expected_ids);
    }

    #[test]
    fn text_runs_give_each_key_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let columns = [Column::new("key", Kind::Str), Column::new("id", Kind::I32)];
        // Keys in runs across a row group's end; "a" again later is a
        // second run.
        let group = crate::table::ROW_GROUP;
        let keys: Vec<&str> = std::iter::repeat_n("a", 3)
            .chain(std::iter::repeat_n("b", group))
            .chain(std::iter::repeat_n("a", 2))
            .collect();
        let mut w = TableWriter::create(&path, &columns).unwrap();
        for (i, k) in keys.iter().enumerate() {
            w.str(k);
            w.i32(i as i32);
            w.end_row().unwrap();
        }
        w.finish().unwrap();
        let g = group as u64;
        assert_eq!(
            text_runs(&path, "key").unwrap(),
            vec![
                ("a".to_string(), 0..3),
                ("b".to_string(), 3..3 + g),
                ("a".to_string(), 3 + g..5 + g),
            ]
        );
        let err = text_runs(&path, "id").unwrap_err().to_string();
        assert!(err.contains("\"id\" does not hold text"), "{err}");
        let err = text_runs(&path, "nope").unwrap_err().to_string();
        assert!(err.contains("no column \"nope\""), "{err}");
    }

    #[test]
    fn an_older_layout_without_a_nullable_column_reads_it_as_null() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        // Without `extra`, and with a column the row does not know.
        let mut older: Vec<Column> = SAMPLE_COLUMNS[..6].to_vec();
        older.push(Column::new("unknown", Kind::Str));
        let rows: Vec<SampleRow> = (0..5).map(sample).collect();
        write(&path, &older, &rows);
        let back: Vec<SampleRow> = read_table(&path, |_| true).unwrap();
        let expected: Vec<SampleRow> = rows
            .into_iter()
            .map(|r| SampleRow { extra: None, ..r })
            .collect();
        assert_eq!(back, expected);
    }

    #[test]
    fn a_missing_required_column_names_the_file_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let without_at: Vec<Column> = SAMPLE_COLUMNS
            .iter()
            .filter(|c| c.name != "at")
            .cloned()
            .collect();
        write(&path, &without_at, &[sample(1)]);
        let err = read_table::<SampleRow>(&path, |_| true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.parquet") && err.contains("no column \"at\""),
            "{err}"
        );
    }

    /// Writes `r` with its third column, `at`, written by `at` (of another
    /// kind or nullness than the sample's).
    fn push_with_at(w: &mut TableWriter, r: &SampleRow, at: impl FnOnce(&mut TableWriter)) {
        w.i32(r.id);
        w.u64(r.big);
        at(w);
        w.opt_str(r.label.as_deref());
        w.f64(r.share);
        w.bool(r.flag);
        w.opt_i64(r.extra);
        w.end_row().unwrap();
    }

    #[test]
    fn a_column_of_another_type_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut retyped: Vec<Column> = SAMPLE_COLUMNS.to_vec();
        retyped[2] = Column::new("at", Kind::Str);
        let mut w = TableWriter::create(&path, &retyped).unwrap();
        push_with_at(&mut w, &sample(2), |w| w.str("not a time"));
        w.finish().unwrap();
        let err = read_table::<SampleRow>(&path, |_| true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.parquet") && err.contains("\"at\" holds Str values, not I64"),
            "{err}"
        );
    }

    #[test]
    fn a_null_where_the_row_wants_a_value_is_an_error_with_its_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut nullable: Vec<Column> = SAMPLE_COLUMNS.to_vec();
        nullable[2] = Column::nullable("at", Kind::I64);
        let mut w = TableWriter::create(&path, &nullable).unwrap();
        for (i, at) in [Some(5), None].into_iter().enumerate() {
            push_with_at(&mut w, &sample(i as i32), |w| w.opt_i64(at));
        }
        w.finish().unwrap();
        let err = read_table::<SampleRow>(&path, |_| true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("row 1") && err.contains("\"at\" holds null"),
            "{err}"
        );
    }
}
