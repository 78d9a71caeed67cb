//! Tables with millions of rows, written through typed columns.
//!
//! [`crate::table::TableWriter`] takes a row's values one call at a time and
//! checks each against its column: about 25 instructions a value, which
//! made writing the thread states, system calls and critical paths a fifth
//! of a whole `analyze`. Here a table is a struct of typed columns
//! ([`columns!`]), so a value costs a `Vec::push`; the struct is checked
//! against the schema once (names, kinds, nullability, order), and each
//! row group's column lengths once per row group.

use std::marker::PhantomData;
use std::path::Path;

use bytes::Bytes;

use crate::kept::KeptTable;
use crate::table::{Buffer, Column, Kind, TableFile, Values, ROW_GROUP};
use crate::Error;

/// A typed column over a buffer of the table file.
pub(crate) trait TypedColumn: Sized {
    /// Whether a column of the schema can be this type.
    fn fits(column: &Column) -> bool;
    /// Takes a buffer of a column that [`TypedColumn::fits`].
    fn new(buffer: Buffer) -> Self;
    fn buffer(&mut self) -> &mut Buffer;
}

/// Values a required or optional column can hold natively.
pub(crate) trait Native: Copy {
    const KIND: &'static [Kind];
    fn vec(values: &mut Values) -> Option<&mut Vec<Self>>;
}

impl Native for i32 {
    const KIND: &'static [Kind] = &[Kind::I32];
    #[inline(always)]
    fn vec(values: &mut Values) -> Option<&mut Vec<i32>> {
        match values {
            Values::I32(v) => Some(v),
            _ => None,
        }
    }
}

impl Native for i64 {
    const KIND: &'static [Kind] = &[Kind::I64, Kind::U64];
    #[inline(always)]
    fn vec(values: &mut Values) -> Option<&mut Vec<i64>> {
        match values {
            Values::I64(v) => Some(v),
            _ => None,
        }
    }
}

impl Native for bool {
    const KIND: &'static [Kind] = &[Kind::Bool];
    #[inline(always)]
    fn vec(values: &mut Values) -> Option<&mut Vec<bool>> {
        match values {
            Values::Bool(v) => Some(v),
            _ => None,
        }
    }
}

/// A column every row has a value in.
pub(crate) struct Required<T> {
    buffer: Buffer,
    _values: PhantomData<T>,
}

impl<T: Native> Required<T> {
    #[inline(always)]
    pub fn push(&mut self, v: T) {
        // Always the variant `fits` checked: a value lost to a mismatch
        // would show as a short column when the row group is written.
        if let Some(values) = T::vec(&mut self.buffer.values) {
            values.push(v);
        }
    }
}

impl Required<i64> {
    /// Nanoseconds and other unsigned values (see
    /// [`crate::table::TableWriter::u64`]).
    #[inline(always)]
    pub fn push_u64(&mut self, v: u64) {
        self.push(v as i64)
    }
}

impl<T: Native> TypedColumn for Required<T> {
    fn fits(column: &Column) -> bool {
        !column.nullable && T::KIND.contains(&column.kind)
    }

    fn new(buffer: Buffer) -> Self {
        Required {
            buffer,
            _values: PhantomData,
        }
    }

    fn buffer(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// A column that may be null.
pub(crate) struct Optional<T> {
    buffer: Buffer,
    _values: PhantomData<T>,
}

impl<T: Native> Optional<T> {
    #[inline(always)]
    pub fn push(&mut self, v: Option<T>) {
        self.buffer.defs.push(v.is_some() as i16);
        if let (Some(v), Some(values)) = (v, T::vec(&mut self.buffer.values)) {
            values.push(v);
        }
    }
}

impl Optional<i64> {
    #[inline(always)]
    pub fn push_u64(&mut self, v: Option<u64>) {
        self.push(v.map(|v| v as i64))
    }
}

impl<T: Native> TypedColumn for Optional<T> {
    fn fits(column: &Column) -> bool {
        column.nullable && T::KIND.contains(&column.kind)
    }

    fn new(buffer: Buffer) -> Self {
        Optional {
            buffer,
            _values: PhantomData,
        }
    }

    fn buffer(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// A string column every row has a value in. Values are shared buffers
/// (see [`crate::table::interned`]), found in the row group's dictionary
/// by address.
pub(crate) struct Text {
    buffer: Buffer,
}

impl Text {
    #[inline(always)]
    pub fn push(&mut self, v: &Bytes) {
        if let Values::Str(values) = &mut self.buffer.values {
            values.push(v);
        }
    }

    #[inline(always)]
    pub fn push_static(&mut self, v: &'static str) {
        if let Values::Str(values) = &mut self.buffer.values {
            values.push_static(v.as_bytes());
        }
    }
}

impl TypedColumn for Text {
    fn fits(column: &Column) -> bool {
        !column.nullable && column.kind == Kind::Str
    }

    fn new(buffer: Buffer) -> Self {
        Text { buffer }
    }

    fn buffer(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// A string column that may be null.
pub(crate) struct OptionalText {
    buffer: Buffer,
}

impl OptionalText {
    #[inline(always)]
    pub fn push(&mut self, v: Option<&Bytes>) {
        self.buffer.defs.push(v.is_some() as i16);
        if let (Some(v), Values::Str(values)) = (v, &mut self.buffer.values) {
            values.push(v);
        }
    }
}

impl TypedColumn for OptionalText {
    fn fits(column: &Column) -> bool {
        column.nullable && column.kind == Kind::Str
    }

    fn new(buffer: Buffer) -> Self {
        OptionalText { buffer }
    }

    fn buffer(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}

/// The columns of a table, as a struct (see [`columns!`]).
pub(crate) trait Columns: Sized {
    /// Builds the struct from the file's buffers, in schema order.
    fn from_buffers(buffers: &mut dyn Iterator<Item = Buffer>) -> Result<Self, String>;
    /// The buffers, in schema order.
    fn buffers(&mut self) -> Vec<&mut Buffer>;
}

/// Takes the next buffer as the column `name` of type `C`.
pub(crate) fn take_column<C: TypedColumn>(
    buffers: &mut dyn Iterator<Item = Buffer>,
    name: &str,
) -> Result<C, String> {
    let Some(buffer) = buffers.next() else {
        return Err(format!("the schema has no column {name}"));
    };
    if buffer.column.name != name {
        return Err(format!(
            "column {name} is at the schema's place of {}",
            buffer.column.name
        ));
    }
    if !C::fits(&buffer.column) {
        return Err(format!(
            "column {name} is {:?}{} in the schema, another type in the table",
            buffer.column.kind,
            if buffer.column.nullable {
                " (nullable)"
            } else {
                ""
            }
        ));
    }
    Ok(C::new(buffer))
}

/// A struct of typed columns, one field per column of the schema, in its
/// order and with its names:
///
/// ```text
/// columns! { struct ThreadStateColumns { tid: Required<i32>, comm: OptionalText } }
/// ```
macro_rules! columns {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        $vis struct $name {
            $(pub $field: $ty,)*
        }

        impl crate::columns::Columns for $name {
            fn from_buffers(
                buffers: &mut dyn Iterator<Item = crate::table::Buffer>,
            ) -> Result<Self, String> {
                Ok($name {
                    $($field: crate::columns::take_column(buffers, stringify!($field))?,)*
                })
            }

            fn buffers(&mut self) -> Vec<&mut crate::table::Buffer> {
                vec![$(crate::columns::TypedColumn::buffer(&mut self.$field),)*]
            }
        }
    };
}

/// A table written row by row into typed columns: push each column's value
/// (`t.columns.tid.push(…)`), then [`ColumnarTable::end_row`].
pub(crate) struct ColumnarTable<C> {
    file: TableFile,
    pub columns: C,
    rows_buffered: usize,
    rows: u64,
}

impl<C: Columns> ColumnarTable<C> {
    /// Creates (or truncates) `path` for a table of these columns, which
    /// `C` must match.
    pub fn create(path: &Path, schema: &[Column]) -> Result<ColumnarTable<C>, Error> {
        let (file, buffers) = TableFile::create(path, schema, None)?;
        let mut buffers = buffers.into_iter();
        let columns = C::from_buffers(&mut buffers).map_err(|what| Error::Schema {
            path: path.to_path_buf(),
            what,
        })?;
        if let Some(extra) = buffers.next() {
            return Err(Error::Schema {
                path: path.to_path_buf(),
                what: format!("the table has no column {}", extra.column.name),
            });
        }
        Ok(ColumnarTable {
            file,
            columns,
            rows_buffered: 0,
            rows: 0,
        })
    }

    /// Ends the current row (every column must have had its value: checked
    /// when the row group is written).
    #[inline(always)]
    pub fn end_row(&mut self) -> Result<(), Error> {
        self.rows_buffered += 1;
        if self.rows_buffered >= ROW_GROUP {
            return self.flush();
        }
        Ok(())
    }

    #[inline(never)]
    fn flush(&mut self) -> Result<(), Error> {
        self.file
            .write_group(self.columns.buffers(), self.rows_buffered)?;
        self.rows += self.rows_buffered as u64;
        self.rows_buffered = 0;
        Ok(())
    }

    /// Keeps a copy of `columns` (those of them in the table) in memory
    /// as they are written, for [`ColumnarTable::finish_kept`].
    pub fn keep(&mut self, columns: &[Column]) {
        self.file.keep(columns);
    }

    /// Rows written so far, buffered ones included.
    pub fn rows(&self) -> u64 {
        self.rows + self.rows_buffered as u64
    }

    /// Writes what is buffered and the footer; returns the rows written.
    pub fn finish(self) -> Result<u64, Error> {
        self.finish_kept().map(|(rows, _)| rows)
    }

    /// [`ColumnarTable::finish`], and the copy kept if asked for.
    pub fn finish_kept(mut self) -> Result<(u64, Option<KeptTable>), Error> {
        self.flush()?;
        let kept = self.file.finish()?;
        Ok((self.rows, kept))
    }
}

pub(crate) use columns;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{read_rows, Cell};

    columns! {
        struct Pair {
            id: Required<i64>,
            name: OptionalText,
        }
    }

    const PAIR: &[Column] = &[
        Column::new("id", Kind::I64),
        Column::nullable("name", Kind::Str),
    ];

    #[test]
    fn rows_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut t = ColumnarTable::<Pair>::create(&path, PAIR).unwrap();
        let name = Bytes::from_static(b"x");
        let rows = ROW_GROUP + 5;
        for i in 0..rows {
            t.columns.id.push(i as i64);
            t.columns.name.push((i % 2 == 1).then_some(&name));
            t.end_row().unwrap();
        }
        assert_eq!(t.finish().unwrap(), rows as u64);
        let got = read_rows(&path, |_| true).unwrap();
        assert_eq!(got.len(), rows);
        assert_eq!(got[ROW_GROUP + 1][0].1, Cell::Int(ROW_GROUP as i64 + 1));
        assert_eq!(got[ROW_GROUP + 1][1].1, Cell::Str("x".into()));
        assert_eq!(got[ROW_GROUP + 2][1].1, Cell::Null);
    }

    #[test]
    fn a_struct_that_does_not_match_its_schema_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let cases: &[(&[Column], &str)] = &[
            (
                &[
                    Column::nullable("name", Kind::Str),
                    Column::new("id", Kind::I64),
                ],
                "place",
            ),
            (
                &[
                    Column::new("id", Kind::I32),
                    Column::nullable("name", Kind::Str),
                ],
                "I32",
            ),
            (
                &[Column::new("id", Kind::I64), Column::new("name", Kind::Str)],
                "another type",
            ),
            (&[Column::new("id", Kind::I64)], "no column name"),
            (
                &[
                    Column::new("id", Kind::I64),
                    Column::nullable("name", Kind::Str),
                    Column::new("more", Kind::Bool),
                ],
                "no column more",
            ),
        ];
        for (schema, says) in cases {
            match ColumnarTable::<Pair>::create(&path, schema) {
                Err(e) => assert!(e.to_string().contains(says), "{e}"),
                Ok(_) => panic!("{schema:?} accepted"),
            }
        }
    }

    #[test]
    fn a_missing_value_is_an_error_when_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut t = ColumnarTable::<Pair>::create(&path, PAIR).unwrap();
        t.columns.id.push(1);
        t.end_row().unwrap();
        let e = t.finish().unwrap_err().to_string();
        assert!(e.contains("column name") && e.contains("has 0 rows"), "{e}");
    }
}
